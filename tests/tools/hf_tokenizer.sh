#!/usr/bin/env bash
# hf_tokenizer.sh — the C reader of Hugging Face byte-level BPE tokenizers (src/data/bpe.c,
# docs/formats.md "Hugging Face tokenizers in C") against the tokenizers library:
#  - four tokenizer.json trained here with the library: GPT-2 style (ByteLevel with its
#    regex; without and with add_prefix_space), the same with its merges written "a b",
#    and Llama 3 style (a Split on Llama 3's pattern, then ByteLevel, ignore_merges), each
#    with special and plain added tokens;
#  - tests/unit/data/test_bpe encodes a set of strings (whitespace runs, contractions in
#    both cases, digits, punctuation, Latin, CJK, Cyrillic, Devanagari, Arabic digits,
#    emoji, combining marks, Unicode spaces, added tokens in the text) and 2000 random ones
#    to the library's ids (encode, add_special_tokens=False), decodes the library's ids to
#    its text (decode) and every text back to itself;
#  - a tokenizer the reader does not support (a normalizer) is refused naming it, and a
#    file cut short as not JSON;
#  - a small model trains 8 steps on hf: shards (tools/tsr-prepare) with the sample line
#    on: the log has the sample lines; tessera generate from a directory holding only the
#    last checkpoint prints the step-8 sample's text greedily, its prompt is the library's
#    ids, and the library decodes its --ids to the same text.
# Exit 0 pass, 1 fail, 77 skip (no tokenizers in the project's venv, no fortunes).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
[ -f /usr/share/games/fortunes/fortunes ] || skip "fortunes not installed (apt-get install fortunes)"
TOP=$(cd "$top_srcdir" && pwd)
VPY=$TOP/.venv/bin/python
venv_ok() { "$VPY" -c "import tokenizers" 2>/dev/null; }
if ! venv_ok; then
  "$TOP/tools/install-deps.sh" >/dev/null 2>&1
  venv_ok || skip "the project's venv $TOP/.venv (tokenizers) cannot be made: run tools/install-deps.sh where PyPI can be reached"
fi
BPE="$top_builddir/tests/unit/data/test_bpe"
[ -x "$BPE" ] || make -C "$top_builddir" tests/unit/data/test_bpe >/dev/null 2>&1
[ -x "$BPE" ] || { bad "no $BPE (make check builds it)"; finish; }
S=$SCRATCH

# ---- the tokenizers
"$VPY" - "$S" <<'PY' || { bad "training the tokenizers"; finish; }
import json, sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
S = sys.argv[1]
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
texts = []
for name in ("fortunes", "computers", "science"):
    texts += open(f"/usr/share/games/fortunes/{name}", encoding="utf-8", errors="replace").read().split("\n%\n")
texts.append("Grüße aus München! Ça va? naïve café 東京都 日本語のテキスト Привет, мир! 123456 ½ ² "
             "٣٤٥ नमस्ते दुनिया 😀👍 \t\ttabs  \n\n\r\n I'm you're it's we've they'll I'd")
def train(name, kind):
    if kind == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=kind == "gpt2_prefix")
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<|endoftext|>", "<|bos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_tokens(["<extra tok>"])
    tok.save(f"{S}/{name}.json")
for kind in ("gpt2", "gpt2_prefix", "llama3"):
    train(kind, kind)
d = json.load(open(f"{S}/gpt2.json", encoding="utf-8"))
d["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
json.dump(d, open(f"{S}/gpt2_strings.json", "w", encoding="utf-8"))
d["normalizer"] = {"type": "NFC"}
json.dump(d, open(f"{S}/nfc.json", "w", encoding="utf-8"))
PY

# ---- encode and decode against the library
cat >"$S/compare.py" <<'PY'
import json, random, subprocess, sys
from tokenizers import Tokenizer
path, bpe = sys.argv[1], sys.argv[2]
prefix_space = len(sys.argv) > 3  # the tokenizer's ByteLevel adds a space before the text
texts = [
    "", " ", "  ", "a", "Hello world", " Hello world", "Hello  world", "Hello   world  ",
    "line one\nline two\n\nline three\r\n\r\nend", "\n", "\n\n\n", "  \n  \n",
    "tab\there\t\tthere\t", "I'm you're he's we've they'll I'd can't",
    "I'M YOU'RE HE'S WE'VE THEY'LL I'D", "'s 'S ' s '' 'x 'hello", "123 4567 89012345 3.14159",
    "1,000,000 x2 2x v1.2.3-rc4 (2024)", "Hello, world! What?! ... --- (a) [b] {c} <d> @e #f $g",
    "foo.bar(baz); // comment", "  leading and trailing  ", "end with spaces   ",
    "Grüße aus München! Ça va? naïve café", "東京都 日本語のテキスト", "Привет, мир!",
    "नमस्ते दुनिया", "½ ² ³ ¼ ٣٤٥ ١٢٣٤", "😀👍 emoji 🎉!", "mixed日本abc123def",
    "\u00a0nbsp\u2003em\u3000ideographic", "e\u0301 combining", "\u2028line\u2029para",
    "x<|endoftext|>y", "<|bos|>Hello<|endoftext|>", "<extra tok> and <extra tok>",
    "ﬁ ligature ＡＢＣ fullwidth １２３", "\t\n\t\n mixed \r white \x0b\x0c space",
]
rng = random.Random(1234)
def char():
    r = rng.random()
    if r < 0.45: return rng.choice("ab Z'\n\t 0123.,!?-\rsltd")
    if r < 0.75: return chr(rng.randint(0x80, 0x2FFF))
    if r < 0.92: return chr(rng.randint(0x3000, 0xD7FF))
    return chr(rng.randint(0x10000, 0x1FAFF))
for _ in range(2000):
    texts.append("".join(char() for _ in range(rng.randint(1, 24))))
tok = Tokenizer.from_file(path)
want = [tok.encode(t, add_special_tokens=False).ids for t in texts]
reqs = "".join("e " + json.dumps(t) + "\n" for t in texts)
reqs += "".join("d " + " ".join(map(str, w)) + "\n" for w in want)
out = subprocess.run([bpe, path], input=reqs.encode(), capture_output=True, check=True)
lines = out.stdout.decode().split("\n")
enc_bad = dec_bad = trip_bad = 0
for i, t in enumerate(texts):
    got = [int(x) for x in lines[i].split()]
    if got != want[i]:
        enc_bad += 1
        if enc_bad <= 3:
            print(f"  encode {t!r}:\n    library {[tok.id_to_token(x) for x in want[i]]}"
                  f"\n    C       {[tok.id_to_token(x) for x in got]}")
    text = bytes.fromhex(lines[len(texts) + i]).decode("utf-8")
    if text != tok.decode(want[i]):
        dec_bad += 1
        if dec_bad <= 3:
            print(f"  decode {want[i]}: library {tok.decode(want[i])!r}, C {text!r}")
    if "<" in t:  # decode leaves special tokens out; add_prefix_space applies around added ones
        continue
    if text != (" " + t if prefix_space and t and not t.startswith(" ") else t):
        trip_bad += 1
print(f"{len(texts)} texts: {enc_bad} encoded otherwise, {dec_bad} decoded otherwise, "
      f"{trip_bad} not decoded back to the text")
sys.exit(1 if enc_bad or dec_bad or trip_bad else 0)
PY
for t in gpt2 gpt2_prefix gpt2_strings llama3; do
  prefix=()
  [ $t = gpt2_prefix ] && prefix=(prefix)
  "$VPY" "$S/compare.py" "$S/$t.json" "$BPE" "${prefix[@]}" >"$S/$t.cmp" 2>&1
  rc=$?
  check "$t: the library's ids and text: $(tail -1 "$S/$t.cmp")" test $rc -eq 0
  [ $rc -eq 0 ] || head -12 "$S/$t.cmp" | sed 's/^/  /'
done
echo v | "$BPE" "$S/nfc.json" >"$S/nfc.out" 2>&1
check "a normalizer is refused, named: $(cat "$S/nfc.out")" \
  grep -q "normalizer 'NFC' is not supported" "$S/nfc.out"
head -c 5000 "$S/gpt2.json" >"$S/cut.json"
echo v | "$BPE" "$S/cut.json" >"$S/cut.out" 2>&1
check "a tokenizer.json cut short is refused: $(cat "$S/cut.out")" \
  grep -q "not JSON: unterminated string at byte\|not JSON: unexpected end at byte\|not JSON: expected" "$S/cut.out"

# ---- training on hf: shards with the sample line, generate from the lone checkpoint
"$top_srcdir/tools/tsr-prepare" --out "$S/data" --tokenizer hf --tokenizer-file "$S/llama3.json" \
  --eos-token "<|endoftext|>" --valid-fraction 0.05 /usr/share/games/fortunes/fortunes \
  >"$S/prepare.log" 2>&1
check "tsr-prepare makes hf:tokenizer.json shards ($(tail -1 "$S/prepare.log" | cut -c1-80))" \
  test -s "$S/data/train_000.bin"
DECK="$top_srcdir/input/tiny.nml"
SMALL=(model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2 model.d_ff=160
  model.seq_len=64 model.vocab_size=1024 train.micro_batch=4 train.global_batch=8
  optim.warmup_steps=2 optim.lr=3e-3 run.log_every=4 run.eval_every=0 model.init_std=0.1
  "data.train=$S/data/train_*.bin" "data.valid=$S/data/valid_*.bin")
"$TESSERA" "$DECK" "${SMALL[@]}" run.max_steps=8 run.sample_every=4 "run.sample_prompt=Q: What" \
  run.out_dir="$S/run" >"$S/run.out" 2>&1
rc=$?
check "hf: 8 steps with run.sample_every=4 (exit $rc)" test $rc -eq 0
[ $rc -eq 0 ] || { tail -20 "$S/run.out"; finish; }
n=$(grep -Ec '^[^ ]+ sample: Q: What' "$S/run/tessera.log")
check "hf: tessera.log has the sample lines of steps 4 and 8 ($n)" test "$n" -eq 2
mkdir -p "$S/alone"
cp "$S/run/ckpt/step_00000008.h5" "$S/alone/"
(cd "$S/alone" && "$TESSERA" generate step_00000008.h5 --prompt "Q: What" --tokens 32 \
  --temperature 0 >../greedy.txt 2>../greedy.err)
rc=$?
check "hf: generate from a directory holding only the checkpoint exits 0 ($rc)" test $rc -eq 0
check "hf: it says the tokenizer is the checkpoint's hf:tokenizer.json" \
  grep -q "^generate: .*tokenizer hf:tokenizer.json (the checkpoint)" "$S/greedy.err"
(cd "$S/alone" && "$TESSERA" generate step_00000008.h5 --prompt "Q: What" --tokens 32 \
  --temperature 0 --ids >../greedy.ids 2>/dev/null)
"$VPY" - "$S" <<'PY'
import re, sys
from tokenizers import Tokenizer
S = sys.argv[1]
tok = Tokenizer.from_file(f"{S}/llama3.json")
eos = tok.token_to_id("<|endoftext|>")
ok = True
# the prompt: the start token and the library's ids of "Q: What"
n = int(re.search(r"context (\d+) token", open(f"{S}/greedy.err").read()).group(1))
want = 1 + len(tok.encode("Q: What", add_special_tokens=False).ids)
print(f"  prompt: {n} tokens with the start token, the library's {want}")
ok &= n == want
# generate's text is the library's decoding of its ids (an end of document a newline)
ids = [int(x) for x in open(f"{S}/greedy.ids").read().split()]
runs, cur = [], []
for i in ids:
    if i == eos:
        runs.append(cur); cur = []
    else:
        cur.append(i)
runs.append(cur)
lib = "\n".join(tok.decode(r) for r in runs)
got = open(f"{S}/greedy.txt", encoding="utf-8").read()[:-1]
print(f"  text: {got[:60]!r}, library {lib[:60]!r}")
ok &= got == lib
# the step-8 sample line is the prompt and that text, escaped as the log does
lines = [re.sub(r"^\d{4}-\d\d-\d\dT\S+ ", "", l) for l in open(f"{S}/run/tessera.log", encoding="utf-8").read().split("\n")]
lines = [l for l in lines if l.startswith("sample: ")]
esc = lambda s: "".join({"\n": "\\n", "\t": "\\t", "\\": "\\\\"}.get(c, c) for c in s)
print(f"  sample: {lines[-1][:70]!r}")
ok &= bool(lines) and lines[-1] == "sample: " + esc("Q: What" + got)
sys.exit(0 if ok else 1)
PY
check "hf: the prompt is the library's ids, the text its decoding, and the step-8 sample line" \
  test $? -eq 0
finish
