#!/usr/bin/env bash
# prepare.sh — tools/tsr-prepare end to end: bytes and spm shards from a small sample of
# fortunes plus a plain text file, checked by an independent reader (inline Python):
# headers, token counts, exact byte round trip of every document, spm ids and spm_decode.
# --split-by cuts one file into paragraphs, lines or pieces of N tokens (checked the same
# way), deterministically, and too few documents for a split is an error.
# Exit 0 pass, 1 fail, 77 skip (no spm_train or no fortunes package).
set -u
top_srcdir=${top_srcdir:-.}
tool=$top_srcdir/tools/tsr-prepare
py=/usr/bin/python3
[ -x "$py" ] || py=python3
fortunes=/usr/share/games/fortunes/fortunes

for t in spm_train spm_encode spm_decode spm_export_vocab; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not found (apt-get install sentencepiece)"; exit 77; }
done
[ -f "$fortunes" ] || { echo "SKIP: $fortunes not found (apt-get install fortunes)"; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tsr_prepare_XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# Input: the first 300 fortune entries (a '%'-separated file) and one plain file that
# is a single document with tabs, leading spaces, blank lines and non-ASCII text.
awk '/^%$/ { n++ } n < 300' "$fortunes" >"$tmp/sample.fortunes"
printf '%%\n' >>"$tmp/sample.fortunes"
printf '  Indented line\n\n\tTabbed — em dash, café, 日本語\nlast line without newline' \
  >"$tmp/plain.txt"
inputs=("$tmp/sample.fortunes" "$tmp/plain.txt")

# The checker: reads shards with struct, splits inputs into documents by the documented
# rule (independently of the tool), and compares.
cat >"$tmp/check.py" <<'EOF'
import glob, os, struct, subprocess, sys

def read_split(d, split):
    toks, names = [], sorted(glob.glob(os.path.join(d, split + "_*.bin")))
    info = None
    for n in names:
        raw = open(n, "rb").read()
        magic, tb, vocab, count = raw[:8], *struct.unpack("<IIQ", raw[8:24])
        name = raw[24:256].split(b"\0")[0].decode()
        assert magic == b"TSRTOK01", (n, magic)
        assert tb in (2, 4) and len(raw) == 256 + count * tb, (n, tb, count, len(raw))
        assert raw[24 + len(name):256] == bytes(232 - len(name)), "header tail not zero"
        fmt = "<%d%s" % (count, "H" if tb == 2 else "I")
        toks += struct.unpack(fmt, raw[256:])
        assert info in (None, (tb, vocab, name)), "shards disagree"
        info = (tb, vocab, name)
    return names, toks, info

def documents(paths):
    docs = []
    for p in paths:
        data = open(p, "rb").read()
        lines = data.split(b"\n")
        if any(l == b"%" for l in lines):
            cur = []
            for i, l in enumerate(lines):
                last = i == len(lines) - 1
                if l == b"%":
                    docs.append(b"".join(cur)); cur = []
                else:
                    cur.append(l if last else l + b"\n")
            docs.append(b"".join(cur))
        else:
            docs.append(data)
    return [d for d in docs if d.strip()]

def interleave(docs, a, b):
    """Labels 't'/'v' if docs is an order-preserving merge of a and b, else None
    (greedy matching is fine for this data)."""
    i = j = 0
    labels = []
    for d in docs:
        if i < len(a) and a[i] == d: i += 1; labels.append("t")
        elif j < len(b) and b[j] == d: j += 1; labels.append("v")
        else: return None
    return labels if i == len(a) and j == len(b) else None

def split_on(toks, sep):
    out, cur = [], []
    for t in toks:
        if t == sep: out.append(cur); cur = []
        else: cur.append(t)
    assert cur == [], "stream does not end with an end-of-document token"
    return out

mode, d, n_shards_min = sys.argv[1], sys.argv[2], int(sys.argv[3])
inputs = sys.argv[4:]
docs = documents(inputs)
tn, tt, ti = read_split(d, "train")
vn, vt, vi = read_split(d, "valid")
assert len(tn) >= n_shards_min, f"{len(tn)} train shards, want >= {n_shards_min}"
assert [os.path.basename(n) for n in tn] == ["train_%03d.bin" % i for i in range(len(tn))], tn
assert ti == vi, (ti, vi)
if mode == "bytes":
    assert ti == (2, 256, "bytes"), ti
    train = [bytes(x) for x in split_on(tt, 0)]
    valid = [bytes(x) for x in split_on(vt, 0)]
    assert len(tt) == sum(len(x) + 1 for x in train)
    assert len(tt) + len(vt) == sum(len(x) + 1 for x in docs), "token count != bytes + one EOD per document"
    assert 0 < len(valid) < len(docs) / 4, f"{len(valid)} valid of {len(docs)}"
    labels = interleave(docs, train, valid)
    assert labels is not None, "documents do not round-trip"
    # the split is the same for every tokenizer: remember it for the spm check
    open(os.path.join(d, "split.txt"), "w").write("\n".join(labels) + "\n")
    print(f"bytes: {len(docs)} documents, train {len(train)} ({len(tt)} tokens), "
          f"valid {len(valid)} ({len(vt)} tokens)")
else:
    prefix = sys.argv[1].split(":", 1)[1]
    pieces = [l.split("\t")[0] for l in open(os.path.join(d, prefix + ".vocab"), encoding="utf-8")]
    assert ti == (2, len(pieces), "spm:" + prefix), (ti, len(pieces))
    assert max(tt + vt) < len(pieces), "token id >= vocab"
    eos = pieces.index("</s>")
    split = open(os.path.join(sys.argv[2], "..", "bytes", "split.txt")).read().split()
    train_docs = [x for x, s in zip(docs, split) if s == "t"]
    valid_docs = [x for x, s in zip(docs, split) if s == "v"]
    train, valid = split_on(tt, eos), split_on(vt, eos)
    assert len(train) == len(train_docs) and len(valid) == len(valid_docs), "document counts differ from bytes mode"
    checks = [(train[i], train_docs[i]) for i in (0, 1, 2, len(train) - 1)] + [(valid[0], valid_docs[0])]
    plain = open(inputs[-1], "rb").read()  # tabs, leading spaces, blank line, UTF-8
    if plain in train_docs:
        checks.append((train[train_docs.index(plain)], plain))
    else:
        checks.append((valid[valid_docs.index(plain)], plain))
    for ids, text in checks:
        r = subprocess.run(["spm_decode", "--model=" + os.path.join(d, prefix + ".model"),
                            "--input_format=id"], input=(" ".join(map(str, ids)) + "\n").encode(),
                           stdout=subprocess.PIPE, check=True)
        got = r.stdout[:-1] if r.stdout.endswith(b"\n") else r.stdout
        assert got == text.decode("utf-8", "replace").encode(), (got[:200], text[:200])
    print(f"spm: vocab {len(pieces)}, train {len(tt)} tokens, valid {len(vt)} tokens, {len(checks)} documents decoded exactly")
EOF

run() { "$py" "$tool" "$@" >"$tmp/out.txt" 2>&1; }

# ---- bytes ----
if run --out "$tmp/bytes" --tokenizer bytes --valid-fraction 0.05 --shard-tokens 5000 \
  "${inputs[@]}" && "$py" "$tmp/check.py" bytes "$tmp/bytes" 3 "${inputs[@]}"; then
  pass "bytes: headers, several train shards, exact round trip of every document"
else
  cat "$tmp/out.txt"; fail "bytes mode"
fi
grep -q "documents (train" "$tmp/out.txt" && pass "summary line: $(tail -n 1 "$tmp/out.txt")" ||
  fail "no summary line"

sum1=$(cd "$tmp/bytes" && md5sum train_*.bin valid_*.bin)
mv "$tmp/bytes/split.txt" "$tmp/split.txt"
run --out "$tmp/bytes" --tokenizer bytes --valid-fraction 0.05 --shard-tokens 5000 "${inputs[@]}"
sum2=$(cd "$tmp/bytes" && md5sum train_*.bin valid_*.bin)
[ "$sum1" = "$sum2" ] && pass "bytes: a second run gives identical shards" || fail "not idempotent"
run --out "$tmp/bytes" --tokenizer bytes --valid-fraction 0.05 "${inputs[@]}"
n=$(ls "$tmp/bytes" | grep -c '^train_')
[ "$n" = 1 ] && pass "bytes: a rerun with bigger shards removes the stale ones" ||
  fail "$n train shards left after rerun"
mv "$tmp/split.txt" "$tmp/bytes/split.txt"

# ---- spm ----
if run --out "$tmp/spm" --prefix tiny --tokenizer spm --vocab-size 400 --valid-fraction 0.05 \
  "${inputs[@]}" && "$py" "$tmp/check.py" spm:tiny "$tmp/spm" 1 "${inputs[@]}"; then
  pass "spm: headers, ids < vocab, spm_decode gives back the documents"
else
  cat "$tmp/out.txt"; fail "spm mode"
fi
[ -f "$tmp/spm/tiny.model" ] && [ -f "$tmp/spm/tiny.vocab" ] && pass "spm: model saved as tiny.model" ||
  fail "no tiny.model"
sum1=$(cd "$tmp/spm" && md5sum tiny.model train_*.bin valid_*.bin)
run --out "$tmp/spm" --prefix tiny --tokenizer spm --vocab-size 400 --valid-fraction 0.05 "${inputs[@]}"
sum2=$(cd "$tmp/spm" && md5sum tiny.model train_*.bin valid_*.bin)
[ "$sum1" = "$sum2" ] && grep -q reusing "$tmp/out.txt" &&
  pass "spm: a second run reuses the model and gives identical shards" || fail "spm not idempotent"
if run --out "$tmp/spm2" --tokenizer spm --spm-model "$tmp/spm/tiny.model" --valid-fraction 0.05 \
  "${inputs[@]}" && cmp -s "$tmp/spm/train_000.bin" "$tmp/spm2/train_000.bin"; then
  pass "spm: --spm-model encodes the same as the trained run"
else
  cat "$tmp/out.txt"; fail "--spm-model"
fi

# ---- errors ----
if run --out "$tmp/err" --tokenizer bytes "$tmp/no_such.txt"; then
  fail "missing input accepted"
else
  grep -q "no_such.txt" "$tmp/out.txt" && pass "missing input: $(cat "$tmp/out.txt")" ||
    fail "missing input message: $(cat "$tmp/out.txt")"
fi
printf '%%\n  \n%%\n' >"$tmp/empty.txt"
if run --out "$tmp/err" --tokenizer bytes "$tmp/empty.txt"; then
  fail "empty corpus accepted"
else
  grep -q "no documents" "$tmp/out.txt" && pass "empty corpus: $(cat "$tmp/out.txt")" ||
    fail "empty corpus message: $(cat "$tmp/out.txt")"
fi
if PATH=/nonexistent run --out "$tmp/err" --tokenizer spm "${inputs[@]}"; then
  fail "spm without spm_train accepted"
else
  grep -q "apt-get install sentencepiece" "$tmp/out.txt" && pass "no spm_train: $(cat "$tmp/out.txt")" ||
    fail "no spm_train message: $(cat "$tmp/out.txt")"
fi

# ---- --split-by: one file cut into documents ----
# A single plain file: fortune entries as paragraphs (blank lines, some of them only
# spaces, between them), a leading blank line and no newline at the end.
{
  printf '\n'
  awk '/^%$/ { n++; print (n % 7 == 0 ? "   " : ""); next } n < 200' "$fortunes"
  printf 'the last paragraph\nhas no newline at the end'
} >"$tmp/book.txt"
cat >"$tmp/split_check.py" <<'EOF'
# split_check.py DIR MODE FILE [FRACTION]: the shards in DIR hold FILE cut into documents by
# MODE (paragraphs, lines or tokens:N, cut here independently of the tool), in order, each
# followed by one end-of-document token, spread over train and valid.  Prints the valid
# documents' indices.  bytes: exact bytes; spm (a model in DIR): tokens:N pieces of the
# ids spm_encode gives the file.
import glob, itertools, os, re, struct, subprocess, sys

def read_split(d, split):
    toks = []
    for n in sorted(glob.glob(os.path.join(d, split + "_*.bin"))):
        raw = open(n, "rb").read()
        tb, vocab, count = struct.unpack("<IIQ", raw[8:24])
        assert raw[:8] == b"TSRTOK01" and len(raw) == 256 + count * tb, n
        toks += struct.unpack("<%d%s" % (count, "H" if tb == 2 else "I"), raw[256:])
    return toks

def split_on(toks, sep):
    out, cur = [], []
    for t in toks:
        if t == sep: out.append(tuple(cur)); cur = []
        else: cur.append(t)
    assert not cur, "stream does not end with an end-of-document token"
    return out

d, mode, path = sys.argv[1], sys.argv[2], sys.argv[3]
frac = float(sys.argv[4]) if len(sys.argv) > 4 else 0.01
data = open(path, "rb").read()
lines = re.findall(rb"[^\n]*\n|[^\n]+$", data)
models = glob.glob(os.path.join(d, "*.model"))
if models:
    n = int(mode.split(":")[1])
    vocab = [l.split("\t")[0] for l in open(models[0][:-6] + ".vocab", encoding="utf-8")]
    sep, nl = vocab.index("</s>"), vocab.index("<0x0A>")
    r = subprocess.run(["spm_encode", "--model=" + models[0], "--output_format=id"],
                       input=data, stdout=subprocess.PIPE, check=True)
    ids = []
    for i, line in enumerate(r.stdout.decode().split("\n")[:-1]):
        ids += ([nl] if i else []) + [int(t) for t in line.split()]
    if data.endswith(b"\n"):
        ids.append(nl)
    docs = [tuple(ids[k:k + n]) for k in range(0, len(ids), n)]
else:
    sep = 0
    if mode == "lines":
        docs = [l for l in lines if l.strip()]
    elif mode == "paragraphs":
        docs = [b"".join(g) for blank, g in itertools.groupby(lines, lambda l: not l.strip())
                if not blank]
    else:
        n = int(mode.split(":")[1])
        docs = [data[k:k + n] for k in range(0, len(data), n)]
    docs = [tuple(x) for x in docs]
train, valid = split_on(read_split(d, "train"), sep), split_on(read_split(d, "valid"), sep)
labels, i, j = [], 0, 0
for x in docs:  # an order-preserving merge of train and valid
    if i < len(train) and train[i] == x: i += 1; labels.append("t")
    elif j < len(valid) and valid[j] == x: j += 1; labels.append("v")
    else: sys.exit(f"document {len(labels)} of {len(docs)} ({mode}) not found in order")
assert i == len(train) and j == len(valid), (i, len(train), j, len(valid))
assert 1 <= len(valid) <= frac * len(docs) + 1, (len(valid), len(docs))
print(f"{mode}: {len(docs)} documents, valid: "
      + " ".join(str(k) for k, l in enumerate(labels) if l == "v"))
EOF
split_ok() { # split_ok DIR MODE [FRACTION]: the check; its output goes to $tmp/split.txt
  "$py" "$tmp/split_check.py" "$1" "$2" "$tmp/book.txt" ${3:+"$3"} >"$tmp/split.txt" 2>&1
}
for mode in paragraphs lines tokens:300; do
  if run --out "$tmp/s_$mode" --tokenizer bytes --split-by "$mode" --valid-fraction 0.05 \
    "$tmp/book.txt" && split_ok "$tmp/s_$mode" "$mode" 0.05; then
    pass "--split-by $mode: $(cut -c1-90 "$tmp/split.txt")"
  else
    cat "$tmp/out.txt" "$tmp/split.txt"; fail "--split-by $mode"
  fi
done
grep -q "warning: the valid split has only [0-9]* tokens" "$tmp/out.txt" &&
  pass "a valid split of 1024 tokens or fewer gets a warning" ||
  { cat "$tmp/out.txt"; fail "no warning about a short valid split"; }
if run --out "$tmp/s_spm" --tokenizer spm --vocab-size 400 --split-by tokens:256 \
  --valid-fraction 0.05 "$tmp/book.txt" && split_ok "$tmp/s_spm" tokens:256 0.05; then
  pass "spm --split-by tokens:256, pieces of the encoded text: $(cut -c1-60 "$tmp/split.txt")"
else
  cat "$tmp/out.txt" "$tmp/split.txt"; fail "spm --split-by tokens:256"
fi

# The default for one plain file is paragraphs, and the tool says so; a file with no
# blank line falls back to lines.
if run --out "$tmp/s_auto" --tokenizer bytes "$tmp/book.txt" && split_ok "$tmp/s_auto" paragraphs &&
  grep -q "one document per paragraph" "$tmp/out.txt" && grep -q "split by paragraphs" "$tmp/out.txt"; then
  pass "one file, no --split-by: $(head -n 1 "$tmp/out.txt")"
else
  cat "$tmp/out.txt" "$tmp/split.txt"; fail "default split of one file"
fi
grep -v '^ *$' "$tmp/book.txt" >"$tmp/lines.txt"
if run --out "$tmp/s_auto2" --tokenizer bytes "$tmp/lines.txt" &&
  grep -q "one document per line" "$tmp/out.txt" && grep -q "split by lines" "$tmp/out.txt"; then
  pass "one file without blank lines: one document per line"
else
  cat "$tmp/out.txt"; fail "default split of a file without blank lines"
fi

# Deterministic: the same seed gives the same files, another seed another split.
split_ok "$tmp/s_paragraphs" paragraphs 0.05
v1=$(cat "$tmp/split.txt")
sum1=$(cd "$tmp/s_paragraphs" && md5sum train_*.bin valid_*.bin)
run --out "$tmp/s_paragraphs" --tokenizer bytes --split-by paragraphs --valid-fraction 0.05 "$tmp/book.txt"
sum2=$(cd "$tmp/s_paragraphs" && md5sum train_*.bin valid_*.bin)
[ "$sum1" = "$sum2" ] && pass "--split-by paragraphs: a second run gives identical shards" ||
  fail "--split-by paragraphs is not deterministic"
run --out "$tmp/s_seed" --tokenizer bytes --split-by paragraphs --valid-fraction 0.05 --seed 7 \
  "$tmp/book.txt"
if split_ok "$tmp/s_seed" paragraphs 0.05 && [ "$(cat "$tmp/split.txt")" != "$v1" ]; then
  pass "--seed 7 picks other valid documents ($(cut -c1-60 "$tmp/split.txt"))"
else
  cat "$tmp/out.txt" "$tmp/split.txt"; fail "--seed does not change the split ($v1)"
fi

# Errors: too few documents for a split, or a bad mode: exit 2 with a message.
printf 'a single line, one document however it is cut\n' >"$tmp/one.txt"
for mode in auto paragraphs lines tokens:1000; do
  run --out "$tmp/err" --tokenizer bytes --split-by "$mode" "$tmp/one.txt"
  rc=$?
  if [ $rc = 2 ] && grep -q "error: .*one.txt gives 1 document.*needs at least 2" "$tmp/out.txt"; then
    pass "one document, --split-by $mode: exit 2"
  else
    cat "$tmp/out.txt"; fail "one document, --split-by $mode: exit $rc"
  fi
done
echo "    $(cat "$tmp/out.txt")"
run --out "$tmp/err" --tokenizer bytes --split-by tokens:1000 --valid-fraction 0 "$tmp/one.txt" &&
  pass "one document with --valid-fraction 0: train only" || fail "--valid-fraction 0 on one document"
for bad in tokens:0 tokens:x words; do
  run --out "$tmp/err" --tokenizer bytes --split-by "$bad" "$tmp/book.txt"
  rc=$?
  if [ $rc = 2 ] && grep -q "error: argument --split-by: '$bad'" "$tmp/out.txt"; then
    pass "--split-by $bad: exit 2"
  else
    cat "$tmp/out.txt"; fail "--split-by $bad: exit $rc"
  fi
done

# --out that cannot be a directory (a file in the way, an unwritable parent): exit 2 naming
# --out, never a Python traceback (it was FileExistsError, exit 1)
: >"$tmp/a_file"
for out in "$tmp/a_file" "$tmp/a_file/sub"; do
  run --out "$out" --tokenizer bytes "$tmp/book.txt"
  rc=$?
  if [ $rc = 2 ] && grep -q "error: --out '$out': cannot create the output directory" "$tmp/out.txt" &&
    ! grep -q Traceback "$tmp/out.txt"; then
    pass "--out $out (not a directory): exit 2"
  else
    cat "$tmp/out.txt"; fail "--out $out (not a directory): exit $rc"
  fi
done
# --prefix names the spm model: with another tokenizer it is ignored, and said so
run --out "$tmp/pfx" --tokenizer bytes --prefix mine "$tmp/book.txt" &&
  grep -q "warning: --prefix is ignored with --tokenizer bytes" "$tmp/out.txt" &&
  pass "--prefix with bytes: a warning" || { cat "$tmp/out.txt"; fail "--prefix with bytes: no warning"; }

echo "prepare.sh: $failed failed"
[ "$failed" = 0 ]
