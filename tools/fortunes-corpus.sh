#!/usr/bin/env bash
# fortunes-corpus.sh — build the demo corpus from Debian's fortunes package.
#
#   tools/fortunes-corpus.sh OUTDIR [vocab_size]      (vocab_size defaults to 2048)
#
# Collects the English fortune files (top level of $FORTUNES_DIR, default
# /usr/share/games/fortunes; *.dat index files, *.u8 links and subdirectories such as
# off/ are skipped), concatenates them into OUTDIR/fortunes.txt with a '%' line between
# entries as in the sources, and runs tsr-prepare with a SentencePiece BPE of vocab_size
# pieces: OUTDIR/train_*.bin, OUTDIR/valid_*.bin, OUTDIR/fortunes.model.  The tsr-prepare
# is the one beside this script: tools/ of the source tree, or the bin/ it was installed in.
# Does nothing when those outputs are newer than every input and were made with the
# same vocab_size.
set -euo pipefail

usage() { echo "usage: $0 OUTDIR [vocab_size]" >&2; exit 2; }
die() { echo "fortunes-corpus: error: $*" >&2; exit 2; }

[ $# -ge 1 ] && [ $# -le 2 ] || usage
out=$1
vocab=${2:-2048}
[[ $vocab =~ ^[0-9]+$ ]] || die "vocab_size '$vocab' is not a whole number"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prepare=$here/tsr-prepare
src=${FORTUNES_DIR:-/usr/share/games/fortunes}

[ -d "$src" ] || die "no fortune files in $src; install them with 'apt-get install fortunes'" \
  "(or set FORTUNES_DIR)"
[ -x "$prepare" ] || die "$prepare is missing or not executable"

# The English text files, in byte order so the corpus is the same everywhere.
files=()
while IFS= read -r -d '' f; do
  case $f in *.dat | *.u8) continue ;; esac
  grep -qI . "$f" || continue # skip anything binary
  files+=("$f")
done < <(find "$src" -maxdepth 1 -type f -print0 | LC_ALL=C sort -z)
[ ${#files[@]} -gt 0 ] || die "no fortune text files in $src; install them with" \
  "'apt-get install fortunes'"

mkdir -p "$out"
stamp=$out/.fortunes-corpus.stamp
want="vocab_size=$vocab files=${#files[@]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$out/fortunes.txt" ] &&
  [ -f "$out/fortunes.model" ] && [ -f "$out/train_000.bin" ] && [ -f "$out/valid_000.bin" ] &&
  [ -z "$(find "${files[@]}" "$prepare" "${BASH_SOURCE[0]}" -newer "$stamp" -print -quit)" ]; then
  echo "fortunes-corpus: $out is up to date (vocab $vocab); remove $stamp to rebuild"
  exit 0
fi

start=$(date +%s.%N)
rm -f "$stamp"
tmp=$(mktemp "$out/.fortunes.txt.XXXXXX")
trap 'rm -f "$tmp"' EXIT
for f in "${files[@]}"; do
  cat "$f" >>"$tmp"
  # every source ends its last entry with a '%' line or not at all: make it one
  [ -z "$(tail -c 1 "$f")" ] || echo >>"$tmp"
  [ "$(tail -n 1 "$f")" = "%" ] || echo "%" >>"$tmp"
done
chmod "$(printf %o $((0666 & ~0$(umask))))" "$tmp" # mktemp made it 0600
mv "$tmp" "$out/fortunes.txt"
trap - EXIT
echo "fortunes-corpus: ${#files[@]} files from $src -> $out/fortunes.txt" \
  "($(wc -c <"$out/fortunes.txt") bytes)"

"$prepare" --out "$out" --prefix fortunes --tokenizer spm --vocab-size "$vocab" \
  --documents percent "$out/fortunes.txt"
echo "$want" >"$stamp"
end=$(date +%s.%N)
echo "fortunes-corpus: done in $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
