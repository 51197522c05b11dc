#!/usr/bin/env bash
# prepare_corpora.sh — tools/tsr-prepare on corpora as they ship, with a Hugging Face
# tokenizer: a byte-level BPE tokenizer.json trained here with the tokenizers library (its
# post-processor adds a BOS that must not reach the shards), JSONL records plain and
# compressed (.gz .bz2 .xz .zst), Parquet (plain and .gz) and a compressed plain-text file,
# found through a directory and a glob.  An independent reader (numpy) checks that the
# shards hold tokenizers' own encoding of every record plus the end-of-document id, split
# into train and valid by the documented rule; the shards are the same bytes for 1, 2 and 4
# workers and for 2 MPI ranks; every kind of bad input stops the run with exit 2, a message
# naming the file and line or row, and no new shard; --skip-bad leaves them out; a run
# killed half-way is resumed, reusing the files already done; the end-of-document rule
# and --eos-token; u32 tokens past 65536 ids; the missing-package message.
# Exit 0 pass, 1 fail, 77 skip (the project's venv cannot be made: no PyPI).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
[ -f /usr/share/games/fortunes/fortunes ] || skip "fortunes not installed (apt-get install fortunes)"
TOP=$(cd "$top_srcdir" && pwd)
VPY=$TOP/.venv/bin/python
venv_ok() { "$VPY" -c "import tokenizers, pyarrow, zstandard, numpy" 2>/dev/null; }
if ! venv_ok; then
  "$TOP/tools/install-deps.sh" >/dev/null 2>&1
  venv_ok || skip "the project's venv $TOP/.venv (tokenizers, pyarrow) cannot be made: run tools/install-deps.sh where PyPI can be reached"
fi
scratch
TOOL=$TOP/tools/tsr-prepare
S=$SCRATCH
prep() { # prep NAME ARGS...: tsr-prepare --out $S/NAME ARGS, output in $S/NAME.log; its exit code
  local name=$1
  shift
  "$TOOL" --out "$S/$name" "$@" >"$S/$name.log" 2>&1
}
shards() { (cd "$S/$1" 2>/dev/null && ls train_*.bin valid_*.bin 2>/dev/null); }
count() { find "$1" -maxdepth 1 -name "$2" 2>/dev/null | wc -l; } # count DIR GLOB
same_shards() { # same_shards A B: the same shard names and bytes
  [ -n "$(shards "$1")" ] && [ "$(shards "$1")" = "$(shards "$2")" ] || return 1
  local f
  for f in $(shards "$1"); do cmp -s "$S/$1/$f" "$S/$2/$f" || return 1; done
}

# ---- the tokenizer and the corpora ----
"$VPY" - "$S" <<'PY' || { bad "making the tokenizer and corpora"; finish; }
import bz2, gzip, json, lzma, os, sys
import pyarrow as pa, pyarrow.parquet as pq, zstandard
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
S = sys.argv[1]
entries = []
for name in ("fortunes", "computers"):
    entries += open(f"/usr/share/games/fortunes/{name}", encoding="utf-8", errors="replace").read().split("\n%\n")
texts = [t + "\n" for t in entries if t.strip()][:1400]
texts[5] = "Unicode: café, naïve, 日本語, emoji 🙂 — and a tab\there\n"
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(texts, trainers.BpeTrainer(
    vocab_size=600, special_tokens=["<|endoftext|>", "<|bos|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
# a BOS from the post-processor, as Llama 3's adds <|begin_of_text|>: not for shards
tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", 1)])
tok.save(f"{S}/tok.json")
# the same with "<s> $A </s>": the post-processor names the end of document
tok2 = Tokenizer.from_file(f"{S}/tok.json")
tok2.add_special_tokens(["<s>", "</s>"])
s, e = tok2.token_to_id("<s>"), tok2.token_to_id("</s>")
tok2.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", s), ("</s>", e)])
os.makedirs(f"{S}/tok2"); tok2.save(f"{S}/tok2/tokenizer.json")
# more than 65536 ids: u32 tokens
tok3 = Tokenizer.from_file(f"{S}/tok.json")
tok3.add_tokens([f"qqz{i}qq" for i in range(66000)])
os.makedirs(f"{S}/tok3"); tok3.save(f"{S}/tok3/tokenizer.json")

def jsonl(recs):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()
recs = [{"id": i, "text": t, "meta": {"source": "fortunes"}} for i, t in enumerate(texts)]
recs[7]["text"] = "   \n"  # whitespace only: dropped
c = f"{S}/corpus"
os.makedirs(f"{c}/more")
open(f"{c}/a.jsonl", "wb").write(jsonl(recs[:300]) + b"\n")  # a blank line at the end
gzip.open(f"{c}/b.jsonl.gz", "wb").write(jsonl(recs[300:500]))
bz2.open(f"{c}/c.jsonl.bz2", "wb").write(jsonl(recs[500:650]))
lzma.open(f"{c}/more/d.jsonl.xz", "wb").write(jsonl(recs[650:800]))
z = zstandard.ZstdCompressor()  # two frames, as a file appended to is
open(f"{c}/more/e.jsonl.zst", "wb").write(z.compress(jsonl(recs[800:900])) + z.compress(jsonl(recs[900:1000])))
pq.write_table(pa.table({"id": list(range(1000, 1200)), "text": texts[1000:1200]}), f"{c}/f.parquet",
               row_group_size=64)
pq.write_table(pa.table({"text": texts[1200:1300]}), f"{S}/g.parquet")
gzip.open(f"{c}/g.parquet.gz", "wb").write(open(f"{S}/g.parquet", "rb").read())
os.unlink(f"{S}/g.parquet")
gzip.open(f"{c}/h.txt.gz", "wb").write("".join(texts[1300:1400]).encode())
open(f"{c}/.hidden.jsonl", "w").write("not read: hidden\n")
PY
CORPUS_FILES=$(cd "$S/corpus" && find . -type f ! -name '.*' | sed 's|^\./||' | LC_ALL=C sort | sed "s|^|$S/corpus/|")

# The checker: expected documents read here (its own decompression, JSON, Parquet), each
# encoded by tokenizers with add_special_tokens=False plus the end-of-document id, split
# by the documented rule; compared with the shards read by numpy.
cat >"$S/check.py" <<'PY'
# check.py DIR TOKENIZER EOS SKIP_BAD FRACTION SEED FILE...
import bz2, gzip, hashlib, io, json, lzma, math, os, sys, glob
import numpy as np, pyarrow.parquet as pq, zstandard
from tokenizers import Tokenizer
d, tok_path, eos_tok, skip_bad, frac, seed = sys.argv[1:7]
files, skip_bad, frac = sys.argv[7:], skip_bad == "1", float(frac)
tok = Tokenizer.from_file(tok_path)
eos = tok.token_to_id(eos_tok)
assert eos is not None, eos_tok

def unzstd(raw):
    out = []
    while raw:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        out.append(dobj.decompress(raw))
        assert dobj.eof, "truncated zstd"
        raw = dobj.unused_data
    return b"".join(out)

def content(path):
    raw = open(path, "rb").read()
    if path.endswith(".gz"): return gzip.decompress(raw), path[:-3]
    if path.endswith(".bz2"): return bz2.decompress(raw), path[:-4]
    if path.endswith(".xz"): return lzma.decompress(raw), path[:-3]
    if path.endswith(".zst"): return unzstd(raw), path[:-4]
    return raw, path

docs, left_out = [], 0
for path in files:
    try:
        data, name = content(path)
        if name.endswith(".parquet"):
            col = pq.read_table(io.BytesIO(data)).column("text").to_pylist()
    except Exception:
        assert skip_bad, f"{path} cannot be read"
        left_out += 1
        continue
    if name.endswith(".jsonl"):
        for line in data.split(b"\n"):
            if not line.strip(): continue
            try: rec = json.loads(line)
            except ValueError: assert skip_bad; continue
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                assert skip_bad; continue
            if rec["text"].strip(): docs.append(rec["text"])
    elif name.endswith(".parquet"):
        docs += [t for t in col if t is not None and t.strip()]
    elif data.strip():
        docs.append(data.decode("utf-8", "replace"))
ids = [tok.encode(t, add_special_tokens=False).ids + [eos] for t in docs]
n = len(ids)
phase = int.from_bytes(hashlib.sha256(f"tsr-prepare valid split {seed}".encode()).digest()[:8], "little") / 2.0**64
valid = [i for i in range(n) if frac > 0 and math.floor((i + 1) * frac + phase) > math.floor(i * frac + phase)]
if frac > 0 and not valid: valid = [n - 1]
vs = set(valid)
want = {"train": [t for i in range(n) if i not in vs for t in ids[i]],
        "valid": [t for i in sorted(vs) for t in ids[i]]}
vocab = max(tok.get_vocab(with_added_tokens=True).values()) + 1
width = 2 if vocab <= 65536 else 4
for split in ("train", "valid"):
    got, names = [], sorted(glob.glob(os.path.join(d, split + "_*.bin")))
    for p in names:
        raw = open(p, "rb").read()
        tb, v, count = np.frombuffer(raw[8:24], "<u4")[0], np.frombuffer(raw[12:16], "<u4")[0], np.frombuffer(raw[16:24], "<u8")[0]
        name = raw[24:256].split(b"\0")[0]
        assert raw[:8] == b"TSRTOK01" and tb == width and v == vocab and name == b"hf:tokenizer.json", (p, tb, v, name)
        assert len(raw) == 256 + int(count) * width, p
        got.append(np.frombuffer(raw[256:], "<u2" if width == 2 else "<u4"))
    got = np.concatenate(got) if got else np.zeros(0, np.int64)
    assert got.tolist() == want[split], f"{split}: {len(got)} tokens, want {len(want[split])}; first difference at " \
        f"{next((i for i, (a, b) in enumerate(zip(got.tolist(), want[split])) if a != b), min(len(got), len(want[split])))}"
assert open(os.path.join(d, "tokenizer.json"), "rb").read() == open(tok_path, "rb").read(), "tokenizer.json not copied"
assert json.load(open(os.path.join(d, "tokenizer_config.json")))["eos_token"] == eos_tok
print(f"{n} documents ({len(valid)} valid), {len(want['train'])} + {len(want['valid'])} tokens, "
      f"u{8 * width}, end of document {eos_tok} = {eos}" + (f", {left_out} files left out" if left_out else ""))
PY
check_out() { # check_out NAME TOKENIZER EOS SKIP_BAD FILE...: the shards in $S/NAME (fraction 0.02)
  local name=$1 tk=$2 eos=$3 sb=$4
  shift 4
  "$VPY" "$S/check.py" "$S/$name" "$tk" "$eos" "$sb" 0.02 1234 "$@" >"$S/$name.check" 2>&1
}
HF=(--tokenizer hf --tokenizer-file "$S/tok.json" --valid-fraction 0.02 --shard-tokens 20000)

# ---- every format, through a directory ----
# shellcheck disable=SC2086 # CORPUS_FILES: one path a line, no spaces in $S
if prep w1 "${HF[@]}" --workers 1 --progress 0.05 "$S/corpus" &&
  check_out w1 "$S/tok.json" "<|endoftext|>" 0 $CORPUS_FILES; then
  ok "jsonl, .gz, .bz2, .xz, .zst, parquet, parquet.gz, txt.gz: tokenizers' ids + EOS: $(cat "$S/w1.check")"
else
  cat "$S/w1.log" "$S/w1.check"; bad "the corpus with a Hugging Face tokenizer"
fi
grep '^tsr-prepare: 8 files' "$S/w1.log" | sed 's/^/    /'
check "a progress line on stderr (files, documents, tokens, MB/s, ETA)" \
  grep -qE '^tsr-prepare: [0-9]+/8 files, [0-9]+ documents, [0-9]+ tokens, [0-9.]+ MB/s, ETA' "$S/w1.log"
check "several train shards" test "$(count "$S/w1" 'train_*.bin')" -ge 3
check "the work directory is removed after a successful run" test ! -e "$S/w1/.tsr-prepare"

# ---- the same bytes for any number of workers and ranks ----
for w in 2 4; do
  prep "w$w" "${HF[@]}" --workers "$w" "$S/corpus/*.*" "$S/corpus/more" # a glob, a directory
  check "--workers $w: the same shards as --workers 1 (exit $?)" same_shards w1 "w$w"
done
if command -v "${MPIRUN:-mpirun}" >/dev/null; then
  "${MPIRUN:-mpirun}" -np 2 "$TOOL" --out "$S/mpi" "${HF[@]}" --workers 1 "$S/corpus" >"$S/mpi.log" 2>&1
  rc=$?
  check "mpirun -np 2: the same shards as one process (exit $rc)" same_shards w1 mpi
  check "mpirun -np 2: rank 1 tokenized files, rank 0 wrote the shards" \
    grep -q "rank 1 of 2).*files tokenized.*rank 0 writes the shards" "$S/mpi.log"
  check "mpirun -np 2: the work directory is removed once both ranks are done" \
    test ! -e "$S/mpi/.tsr-prepare"
  [ "$TESTS_FAILED" -eq 0 ] || cat "$S/mpi.log"
else
  echo "    (no mpirun: the 2-rank run is not checked)"
fi

# ---- bad input: exit 2, file and line or row named, no shard published ----
mkdir "$S/bad"
"$VPY" - "$S" <<'PY'
import gzip, json, sys, zstandard
import pyarrow as pa, pyarrow.parquet as pq
S = sys.argv[1]
good = [json.dumps({"text": f"good record {i}\n"}) for i in range(6)]
def put(name, lines):
    open(f"{S}/bad/{name}", "w").write("\n".join(lines) + "\n")
put("notjson.jsonl", good[:2] + ['{"text": "unterminated'] + good[2:])
put("nofield.jsonl", good[:1] + ['{"body": "no text field here"}'] + good[1:])
put("notstring.jsonl", good[:3] + ['{"text": 42}'] + good[3:])
data = gzip.compress(("\n".join(good * 400) + "\n").encode())
open(f"{S}/bad/truncated.jsonl.gz", "wb").write(data[:len(data) // 2])
data = zstandard.ZstdCompressor().compress(("\n".join(good * 400) + "\n").encode())
open(f"{S}/bad/truncated.jsonl.zst", "wb").write(data[:len(data) // 2])
open(f"{S}/bad/corrupt.parquet", "wb").write(b"PAR1" + bytes(range(256)) * 4)
pq.write_table(pa.table({"text": ["row one\n", None, "row three\n"]}), f"{S}/bad/null.parquet")
pq.write_table(pa.table({"body": ["no text column\n"]}), f"{S}/bad/nocolumn.parquet")
PY
cp "$S/corpus/a.jsonl" "$S/bad/unreadable.jsonl"
chmod 000 "$S/bad/unreadable.jsonl"
declare -A WHERE=([notjson.jsonl]=':3: not a JSON record' [nofield.jsonl]=":2: the record has no 'text' field"
  [notstring.jsonl]=":4: 'text' is a number, not a string" [truncated.jsonl.gz]=': after line [0-9]*: cannot read the gzip stream'
  [truncated.jsonl.zst]=':\( after line [0-9]*:\)\? cannot read the zstd stream' [corrupt.parquet]=': not a readable Parquet file'
  [null.parquet]=": row 2: 'text' is null" [nocolumn.parquet]=": no column 'text'"
  [unreadable.jsonl]=': cannot open: Permission denied')
as_user=()
why_not=''
if [ "$(id -u)" = 0 ]; then # root reads a mode-000 file: run that case as nobody
  chmod 755 "$S" && chmod 777 "$S/bad" && chmod 644 "$S/corpus/a.jsonl"
  as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$S/bad")
  if ! command -v setpriv >/dev/null; then
    why_not="no setpriv to run it as nobody"
  elif ! "${as_user[@]}" "$VPY" -c "import tokenizers" 2>/dev/null || ! "${as_user[@]}" test -r "$TOOL"; then
    why_not="the tree or its .venv is not readable by nobody"
  fi
fi
for f in notjson.jsonl nofield.jsonl notstring.jsonl truncated.jsonl.gz truncated.jsonl.zst \
  corrupt.parquet null.parquet nocolumn.parquet unreadable.jsonl; do
  run=()
  if [ "$f" = unreadable.jsonl ]; then
    [ -n "$why_not" ] && { echo "    ($f not checked: $why_not)"; continue; }
    [ "$(id -u)" = 0 ] && run=("${as_user[@]}")
  fi
  "${run[@]}" "$TOOL" --out "$S/bad/out_$f" "${HF[@]}" "$S/corpus/a.jsonl" "$S/bad/$f" >"$S/bad/$f.log" 2>&1
  rc=$?
  if [ $rc = 2 ] && grep -q "error: $S/bad/$f${WHERE[$f]}" "$S/bad/$f.log" &&
    [ -z "$(shards "bad/out_$f")" ]; then
    ok "$f: exit 2, no shard: $(grep -o "error: .*" "$S/bad/$f.log" | sed "s|$S/||g" | cut -c1-110)"
  else
    cat "$S/bad/$f.log"; bad "$f: exit $rc, want 2 with '${WHERE[$f]}' and no shard"
  fi
done
if command -v "${MPIRUN:-mpirun}" >/dev/null; then # whichever rank reads the bad file
  "${MPIRUN:-mpirun}" -np 2 "$TOOL" --out "$S/bad/out_mpi" "${HF[@]}" --workers 1 "$S/corpus/a.jsonl" \
    "$S/corpus/b.jsonl.gz" "$S/bad/notstring.jsonl" >"$S/bad/mpi.log" 2>&1
  rc=$?
  check "mpirun -np 2, a bad record: exit 2 ($rc), the file and line named, no shard" \
    test $rc = 2 -a -n "$(grep "error: $S/bad/notstring.jsonl:4:" "$S/bad/mpi.log")" -a -z "$(shards bad/out_mpi)"
fi
# a failed rerun into a directory with shards leaves them as they were
prep keep "${HF[@]}" "$S/corpus/a.jsonl"
before=$(cd "$S/keep" && md5sum train_*.bin valid_*.bin)
prep keep "${HF[@]}" "$S/corpus/a.jsonl" "$S/bad/notjson.jsonl"
rc=$?
check "a failed rerun (exit $rc) leaves the earlier shards untouched" \
  test $rc = 2 -a "$before" = "$(cd "$S/keep" && md5sum train_*.bin valid_*.bin)"
check "... and no temporary shard" test "$(count "$S/keep" '*.tmp')" = 0

# --skip-bad: bad records left out one by one, damaged files whole, with warnings and a count
BAD_FILES=$(for f in notjson.jsonl nofield.jsonl notstring.jsonl truncated.jsonl.gz truncated.jsonl.zst \
  corrupt.parquet null.parquet nocolumn.parquet; do echo "$S/bad/$f"; done)
# shellcheck disable=SC2086
if prep skip "${HF[@]}" --skip-bad "$S/corpus/a.jsonl" $BAD_FILES &&
  check_out skip "$S/tok.json" "<|endoftext|>" 1 "$S/corpus/a.jsonl" $BAD_FILES &&
  grep -q "warning: --skip-bad: left out 4 bad records and 4 damaged files" "$S/skip.log" &&
  grep -q "warning: skipped $S/bad/notjson.jsonl:3: not a JSON record" "$S/skip.log"; then
  ok "--skip-bad: $(cat "$S/skip.check")"
  grep 'warning' "$S/skip.log" | sed "s|$S/||g; s/^/    /" | cut -c1-130
else
  cat "$S/skip.log" "$S/skip.check"; bad "--skip-bad"
fi

# ---- an interrupted run resumes ----
(TSR_PREPARE_KILL_AFTER=3 prep resume "${HF[@]}" --workers 1 "$S/corpus") 2>/dev/null # no "Killed"
rc=$?
sleep 0.5 # the killed run's worker may still be finishing a file
parts=$(count "$S/resume/.tsr-prepare" '*.part')
check "a run killed after 3 files (exit $rc): no shard, >= 3 files kept in DIR/.tsr-prepare ($parts)" \
  test $rc = 137 -a -z "$(shards resume)" -a "$parts" -ge 3
prep resume "${HF[@]}" --workers 2 "$S/corpus"
rc=$?
check "the rerun (exit $rc) reuses them: $(grep -o '[0-9]* of 8 files tokenized by an earlier run' "$S/resume.log")" \
  grep -q "[3-8] of 8 files tokenized by an earlier run: reused" "$S/resume.log"
check "... and gives the same shards as an uninterrupted run" same_shards w1 resume
prep keepwork "${HF[@]}" --keep-work "$S/corpus/a.jsonl"
prep keepwork "${HF[@]}" "$S/corpus/a.jsonl"
check "--keep-work keeps the work directory, and the next run reuses it" \
  grep -q "1 of 1 files tokenized by an earlier run" "$S/keepwork.log"

# ---- the end-of-document token ----
prep eos2 --tokenizer hf --tokenizer-file "$S/tok2/tokenizer.json" --valid-fraction 0.02 "$S/corpus/a.jsonl"
check_out eos2 "$S/tok2/tokenizer.json" "</s>" 0 "$S/corpus/a.jsonl"
rc=$?
check "post-processor '<s> \$A </s>': end of document </s>, no <s>: $(cat "$S/eos2.check")" test $rc = 0
eot=$("$VPY" -c "import sys; from tokenizers import Tokenizer; print(Tokenizer.from_file(sys.argv[1]).token_to_id('<|bos|>'))" "$S/tok.json")
prep eos_id "${HF[@]}" --eos-token "$eot" "$S/corpus/a.jsonl"
check "--eos-token $eot (an id)" check_out eos_id "$S/tok.json" "<|bos|>" 0 "$S/corpus/a.jsonl"
prep eos_tok "${HF[@]}" --eos-token "</s>" --tokenizer-file "$S/tok2/tokenizer.json" "$S/corpus/a.jsonl"
check "--eos-token </s> over the default" grep -q "end of document '</s>'" "$S/eos_tok.log"
printf '{"eos_token": "<|bos|>"}\n' >"$S/tok2/tokenizer_config.json"
prep eos_cfg --tokenizer hf --tokenizer-file "$S/tok2/tokenizer.json" --valid-fraction 0.02 "$S/corpus/a.jsonl"
check "eos_token of a tokenizer_config.json beside the tokenizer" \
  check_out eos_cfg "$S/tok2/tokenizer.json" "<|bos|>" 0 "$S/corpus/a.jsonl"
prep eos_bad "${HF[@]}" --eos-token "<nope>" "$S/corpus/a.jsonl"
rc=$?
check "--eos-token that is not a token: exit 2 ($rc)" test $rc = 2
check "... naming it" grep -q "error: --eos-token '<nope>' is not a token" "$S/eos_bad.log"

# ---- more than 65536 ids: u32 ----
prep u32 --tokenizer hf --tokenizer-file "$S/tok3/tokenizer.json" --valid-fraction 0.02 "$S/corpus/b.jsonl.gz"
check_out u32 "$S/tok3/tokenizer.json" "<|endoftext|>" 0 "$S/corpus/b.jsonl.gz"
rc=$?
check "66600 ids: u32 tokens: $(cat "$S/u32.check")" test $rc = 0

# ---- --text-field, globs ----
"$VPY" -c "
import json, sys
for line in open(sys.argv[1]):
    if line.strip(): r = json.loads(line); print(json.dumps({'content': r['text']}))" "$S/corpus/a.jsonl" >"$S/content.jsonl"
prep field "${HF[@]}" --text-field content "$S/content.jsonl"
prep glob "${HF[@]}" "$S/corpus/a.json*"
check "--text-field content gives what 'text' gave" same_shards field glob

# ---- without the packages ----
if ! /usr/bin/python3 -c "import tokenizers" 2>/dev/null; then
  TSR_VENV=none /usr/bin/python3 "$TOOL" --out "$S/nolib" "${HF[@]}" "$S/corpus/a.jsonl" >"$S/nolib.log" 2>&1
  rc=$?
  check "no tokenizers package: exit 1 naming tools/install-deps.sh: $(cut -c1-100 "$S/nolib.log")" \
    test $rc = 1 -a -n "$(grep "needs the Python package 'tokenizers'.*tools/install-deps.sh" "$S/nolib.log")"
fi
finish
