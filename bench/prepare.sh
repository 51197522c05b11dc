#!/usr/bin/env bash
# prepare.sh — tools/tsr-prepare's throughput with a Hugging Face tokenizer, in one run:
#  1. tokens/s of `tsr-prepare --workers C` (C = the cores), the whole command from start
#     to published shards, against the tokenizers library's own encode_batch of the same
#     records, already in memory, on the same C cores (its Rayon threads; the faster of one
#     call and calls of 1024 records): target >= 0.8;
#  2. --workers 2 against --workers 1: target >= 1.6 times on 2 cores.
# Also timed: encode_batch_fast, which tsr-prepare calls (the same ids, no offsets).
# The corpus: MB megabytes (default 32) of JSONL records made from Debian's fortunes (each
# record an entry with a tenth of its words swapped for other fortune words, seeded) in
# FILES files (default 16); the tokenizer: a byte-level BPE of 16000 pieces trained on the
# first 20000 records.  The runs alternate REPS times (default 3) and each one's best
# (shortest) time is compared, as the machine is shared; the load average is printed, and
# the CPU seconds each used (tsr-prepare: the whole command, its workers included), which
# a neighbour's load changes less than the wall time.
# Never fails on time.
# Usage: bench/prepare.sh [MB] [FILES] [REPS]
set -u
MB=${1:-32}; FILES=${2:-16}; REPS=${3:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
VPY=$here/.venv/bin/python
"$VPY" -c "import tokenizers" 2>/dev/null || { echo "no $here/.venv with tokenizers: run tools/install-deps.sh"; exit 1; }
C=$(nproc)
W=$(mktemp -d /tmp/tsr-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$W" "$MB" "$FILES" <<'PY'
import glob, json, os, random, sys
W, mb, nfiles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
entries = []
for f in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if f.endswith((".dat", ".u8")) or os.path.islink(f) or not os.path.isfile(f):
        continue
    entries += [e for e in open(f, "rb").read().decode("utf-8", "replace").split("\n%\n") if e.strip()]
words = sorted(set(w for e in entries for w in e.split()))
os.makedirs(f"{W}/corpus")
k, per = 0, (mb << 20) // nfiles
for i in range(nfiles):
    with open(f"{W}/corpus/part{i:03d}.jsonl", "w") as out:
        size = 0
        while size < per:
            toks = entries[rng.randrange(len(entries))].split(" ")
            for j in range(len(toks)):
                if rng.random() < 0.1:
                    toks[j] = rng.choice(words)
            line = json.dumps({"id": k, "text": " ".join(toks)}) + "\n"
            out.write(line)
            size += len(line)
            k += 1
PY

# The reference: encode_batch on C Rayon threads over the records in memory, as one call
# and as calls of 1024 records (as tsr-prepare batches), the faster of the two; the first
# run trains the tokenizer instead.  Prints "TOKENS SECONDS CPU_SECONDS" (tokens: ids + one
# EOS a record; CPU: all its threads).
cat >"$W/ref.py" <<'PY'
import glob, json, os, sys, time
W, method = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "encode_batch"
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
texts = [json.loads(l)["text"] for f in sorted(glob.glob(f"{W}/corpus/*.jsonl")) for l in open(f)]
if not os.path.exists(f"{W}/tok.json"):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts[:20000], trainers.BpeTrainer(
        vocab_size=16000, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(f"{W}/tok.json")
    print(f"{len(texts)} records", file=sys.stderr)
    sys.exit(0)
tok = Tokenizer.from_file(f"{W}/tok.json")
best = None
for batch in (len(texts), 1024):  # one call, and calls of 1024 records: the faster
    t, c = time.perf_counter(), time.process_time()
    encs = [getattr(tok, method)(texts[i:i + batch], add_special_tokens=False)
            for i in range(0, len(texts), batch)]
    run = (time.perf_counter() - t, time.process_time() - c)
    best = run if best is None else min(best, run)
print(sum(len(e.ids) for part in encs for e in part) + len(texts), f"{best[0]:.3f} {best[1]:.3f}")
PY
"$VPY" "$W/ref.py" "$W" 2>"$W/records.txt" || { echo "training the tokenizer failed"; exit 1; }
echo "corpus: $(du -sm "$W/corpus" | cut -f1) MB of JSONL in $FILES files, $(cat "$W/records.txt"); $C cores"

prep() { # prep WORKERS: "TOKENS SECONDS CPU_SECONDS" of one tsr-prepare run (CPU: its workers too)
  rm -rf "$W/out"
  /usr/bin/python3 -c '
import resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[2:], stdout=open(sys.argv[1], "w"), stderr=subprocess.STDOUT).returncode
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{time.perf_counter() - t:.3f} {ru.ru_utime + ru.ru_stime:.3f}" if rc == 0 else "failed")' \
    "$W/prep.log" "$here/tools/tsr-prepare" --out "$W/out" --tokenizer hf --tokenizer-file "$W/tok.json" \
    --workers "$1" --progress 0 "$W/corpus" >"$W/time.txt"
  grep -q failed "$W/time.txt" && { cat "$W/prep.log" >&2; echo "0 0 0"; return; }
  echo "$(sed -n 's/.*train \([0-9]*\) tokens in.*valid \([0-9]*\) tokens in.*/\1 \2/p' "$W/prep.log" |
    awk '{ print $1 + $2 }') $(cat "$W/time.txt")"
}

declare -A secs cpu tokens
runs=(ref fast "w$C" w1)
[ "$C" != 2 ] && runs+=(w2)
for _ in $(seq "$REPS"); do
  for r in "${runs[@]}"; do
    if [ "$r" = ref ] || [ "$r" = fast ]; then
      out=$(RAYON_NUM_THREADS=$C TOKENIZERS_PARALLELISM=true "$VPY" "$W/ref.py" "$W" \
        "$([ "$r" = ref ] && echo encode_batch || echo encode_batch_fast)")
    else
      out=$(prep "${r#w}")
    fi
    read -r t s c <<<"$out"
    tokens[$r]=$t
    secs[$r]="${secs[$r]:-} $s"
    cpu[$r]="${cpu[$r]:-} $c"
  done
done
best() { tr ' ' '\n' <<<"$1" | grep . | sort -g | head -n 1; }
printf '%-38s %7s %10s %7s %12s   %s\n' "run ($REPS each, alternating)" "best s" "Mtokens/s" "CPU s" "Mtok/CPU s" "all runs (s)"
for r in "${runs[@]}"; do
  case $r in
  ref) what="encode_batch, $C threads (reference)" ;;
  fast) what="encode_batch_fast, $C threads" ;;
  *) what="tsr-prepare --workers ${r#w}" ;;
  esac
  b=$(best "${secs[$r]}")
  c=$(best "${cpu[$r]}")
  printf '%-38s %7.2f %10.3f %7.2f %12.3f  %s\n' "$what" "$b" "$(awk -v t="${tokens[$r]}" -v b="$b" 'BEGIN { print t / b / 1e6 }')" \
    "$c" "$(awk -v t="${tokens[$r]}" -v b="$c" 'BEGIN { print t / b / 1e6 }')" "${secs[$r]}"
done
[ "${tokens[ref]}" = "${tokens[w$C]}" ] && echo "tokens: ${tokens[ref]} on both sides" ||
  echo "tokens differ: reference ${tokens[ref]}, tsr-prepare ${tokens[w$C]}"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "tokens/s, tsr-prepare --workers $C / encode_batch: $(ratio "$(best "${secs[ref]}")" "$(best "${secs[w$C]}")") (target >= 0.8)"
echo "tsr-prepare --workers 2 / --workers 1: $(ratio "$(best "${secs[w1]}")" "$(best "${secs[w2]}")") times (target >= 1.6 on 2 cores)"
echo "tokens per CPU second, tsr-prepare --workers $C / encode_batch: $(ratio "$(best "${cpu[ref]}")" "$(best "${cpu[w$C]}")")" \
  "(CPU s: the least of the runs; the reference's counts its encode_batch calls only)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
