#!/usr/bin/env bash
# export_hf.sh — tools/tsr-export --hf and its inputs, end to end on the fortunes corpus
# (SentencePiece): a llama (grouped-query, untied head), a gpt2 (tied head) and a llama with
# Llama 3.1's RoPE scaling and a context beyond its seq_len train 4 steps
# from relative data paths, `tessera eval` gives each one's validation loss, and the
# exported Hugging Face directories reproduce it to 1e-4 in tests/ref/hf_forward.py, a forward
# written from HF's conventions alone (and with AutoModelForCausalLM when transformers is
# importable).  Also: config.json and the safetensors metadata carry the model's
# definition and the tokenizer, found from the deck's shards even when exporting from
# elsewhere; a run directory, ckpt/latest and the .h5 give the same file; a damaged newest
# checkpoint is skipped in a run directory exactly as `tessera eval` skips it, and refused
# (exit 2) when named; a moved checkpoint names its stored tokenizer but copies no model unless given
# --tokenizer-model; gpt2 with grouped-query attention is refused for --hf (exit 2).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
[ -x "$TESSERA" ] || skip "no $TESSERA (run make first)"
"$PYTHON_REF" -c "import torch, h5py, numpy" 2>/dev/null || skip "no torch/h5py/numpy in $PYTHON_REF"
corpus
scratch
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
TSR=$(abs "$TESSERA")
EXPORT=$(abs "$top_srcdir/tools/tsr-export")
FORWARD=$(abs "$top_srcdir/tests/ref/hf_forward.py")
DECK=$(abs "$top_srcdir/input/tiny.nml")
CORPUS=$(abs "$CORPUS")
ln -s "$CORPUS" "$SCRATCH/data"
COMMON=(model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=160 model.seq_len=64
  model.init_std=0.1 train.micro_batch=4 train.global_batch=4 optim.lr=1e-2
  optim.warmup_steps=0 run.max_steps=4 run.eval_every=0 run.eval_steps=3
  checkpoint.every_steps=2 checkpoint.keep=3 "data.train=data/train_*.bin"
  "data.valid=data/valid_*.bin")
cases=(
  "llama: model.arch=llama model.n_kv_head=2"
  "gpt2: model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true."
  "gpt2gqa: model.arch=gpt2 model.n_kv_head=2 run.max_steps=1"
  # Llama 3.1's RoPE rescaling (an original context of 64: the frequencies of a head of 16
  # fall in all three bands) and a context beyond the run's 64 positions
  "llama3: model.arch=llama model.n_kv_head=2 model.rope_theta=500000 model.rope_scaling=llama3
   model.rope_factor=8 model.rope_low_freq_factor=1 model.rope_high_freq_factor=4
   model.rope_original_context=64 model.max_positions=128"
)
run_case() { # run_case NAME tessera-args...: from $SCRATCH, so the data paths are relative
  local name=$1
  shift
  # shellcheck disable=SC2086  # the overrides are words on purpose
  (cd "$SCRATCH" && "$TSR" "$@" "$DECK" "${COMMON[@]}" ${spec#*:} run.out_dir="runs/$name")
}
val_loss() { "$PYTHON_REF" -c "import json, sys; print(repr([json.loads(l) for l in
  open(sys.argv[1]) if 'val_loss' in l][-1]['val_loss']))" "$1"; }

for spec in "${cases[@]}"; do
  name=${spec%%:*}
  run_case "$name" >"$SCRATCH/$name.out" 2>&1
  check "$name: tessera trains (exit $?)" test $? -eq 0
done
for name in llama gpt2 llama3; do
  for spec in "${cases[@]}"; do [ "${spec%%:*}" = "$name" ] && break; done
  run_case "$name" eval >"$SCRATCH/$name.eval" 2>&1
  check "$name: tessera eval (exit $?)" test $? -eq 0
  eval "VAL_$name=\$(val_loss \"\$SCRATCH/runs/$name/eval.jsonl\")"
done
RUN=$SCRATCH/runs/llama

# ---- inputs: a run directory (exported from elsewhere), ckpt/latest, the file ----
(cd / && "$EXPORT" "$RUN" "$SCRATCH/dir.safetensors" --hf "$SCRATCH/hf_llama") >"$SCRATCH/e1.out" 2>&1
check "llama: export of the run directory with --hf, from / (exit $?)" test $? -eq 0
check "  ... took step 4, the newest" grep -q "step_00000004.h5 (the newest usable" "$SCRATCH/e1.out"
"$EXPORT" "$RUN/ckpt/latest" "$SCRATCH/latest.safetensors" >"$SCRATCH/e2.out" 2>&1
check "llama: export of ckpt/latest (exit $?)" test $? -eq 0
"$EXPORT" "$RUN/ckpt/step_00000004.h5" "$SCRATCH/file.safetensors" >"$SCRATCH/e3.out" 2>&1
check "llama: export of the .h5 (exit $?)" test $? -eq 0
check "  ... the three inputs give the same file" \
  sh -c "cmp -s '$SCRATCH/dir.safetensors' '$SCRATCH/file.safetensors' &&
         cmp -s '$SCRATCH/latest.safetensors' '$SCRATCH/file.safetensors'"
check "  ... tokenizer.model is the corpus's SentencePiece model" \
  cmp -s "$SCRATCH/hf_llama/tokenizer.model" "$CORPUS/fortunes.model"
(cd "$SCRATCH" && "$EXPORT" runs/gpt2/ckpt/latest --hf hf_gpt2) >"$SCRATCH/e4.out" 2>&1
check "gpt2: export of ckpt/latest with --hf (exit $?)" test $? -eq 0
(cd "$SCRATCH" && "$EXPORT" runs/llama3 --hf hf_llama3) >"$SCRATCH/e5.out" 2>&1
check "llama3: export with --hf (exit $?)" test $? -eq 0
check "  ... config.json has rope_scaling llama3 and the context of 128 positions" \
  "$PYTHON_REF" -c "import json, sys; c = json.load(open(sys.argv[1]))
sys.exit(0 if c['rope_scaling'] == {'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0,
  'high_freq_factor': 4.0, 'original_max_position_embeddings': 64} and
  c['max_position_embeddings'] == 128 and c['rope_theta'] == 500000.0 else 1)" "$SCRATCH/hf_llama3/config.json"

"$PYTHON_REF" - "$RUN/ckpt/step_00000004.h5" "$SCRATCH/dir.safetensors" "$SCRATCH/hf_llama" \
  "$SCRATCH/hf_gpt2" <<'PY'
import json, struct, sys
import h5py
ck, st, hf_llama, hf_gpt2 = sys.argv[1:5]
fails = 0
def say(ok, what):
    global fails
    print(("PASS: " if ok else "FAIL: ") + what)
    fails += not ok
blob = open(st, "rb").read()
meta = json.loads(blob[8:8 + struct.unpack("<Q", blob[:8])[0]])["__metadata__"]
with h5py.File(ck, "r") as f:
    a = {k: f.attrs[k] for k in f.attrs}
    deck = a["deck"].decode() if isinstance(a["deck"], bytes) else str(a["deck"])
dims = ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "vocab_size", "seq_len")
say(all(meta[k] == str(int(a[k])) for k in dims) and meta["arch"] == "llama" and
    meta["head_dim"] == "16" and meta["tie_embeddings"] == "false",
    "metadata: arch and every dimension as the checkpoint's attributes")
say(float(meta["rope_theta"]) == 10000.0 and float(meta["norm_eps"]) == 1e-5 and
    meta["rope"] == "half-split" and meta["deck"] == deck,
    "metadata: rope_theta, norm_eps, the RoPE convention and the effective deck")
say(meta["tokenizer"] == "spm:fortunes" and meta["tokenizer_vocab_size"] == "2048",
    f"metadata: the shards' tokenizer spm:fortunes, found from the run's relative data path "
    f"({meta['tokenizer']!r})")
want = {hf_llama: {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64,
                   "tie_word_embeddings": False, "vocab_size": 2048, "hidden_act": "silu",
                   "torch_dtype": "float32", "eos_token_id": 2},
        hf_gpt2: {"model_type": "gpt2", "n_embd": 64, "n_inner": 160, "n_layer": 2, "n_head": 4,
                  "n_positions": 64, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
                  "activation_function": "gelu_new", "vocab_size": 2048}}
for d, w in want.items():
    c = json.load(open(f"{d}/config.json"))
    bad = {k: c.get(k) for k in w if c.get(k) != w[k]}
    say(not bad, f"{w['model_type']}: config.json has the deck's model ({bad or 'all fields'})")
    t = json.load(open(f"{d}/tokenizer_config.json"))
    say(t["tokenizer_class"] == "LlamaTokenizer" and t["eos_token"] == "</s>" and
        t["model_max_length"] == 64 and not t["add_bos_token"],
        f"{w['model_type']}: tokenizer_config.json names LlamaTokenizer, </s>, 64 positions")
sys.exit(1 if fails else 0)
PY
check "metadata and config.json describe the model (see above)" test $? -eq 0

for name in llama gpt2 llama3; do
  eval "expected=\$VAL_$name"
  "$PYTHON_REF" "$FORWARD" "$SCRATCH/hf_$name" "$CORPUS/valid_*.bin" 4 3 "$expected" 2>&1 |
    grep -v -i "warn" | sed 's/^/  /'
  check "$name: the HF directory reproduces tessera eval's val loss $expected" \
    test "${PIPESTATUS[0]}" -eq 0
done

# ---- what is refused, and what has no tokenizer ----
"$EXPORT" "$SCRATCH/runs/gpt2gqa" --hf "$SCRATCH/hf_gqa" >"$SCRATCH/gqa.out" 2>&1
check "gpt2 with n_kv_head < n_head: --hf refused with exit 2 (got $?)" test $? -eq 2
check "  ... saying why, and writing nothing" \
  sh -c "grep -q 'error: .*grouped-query' '$SCRATCH/gqa.out' && test ! -e '$SCRATCH/hf_gqa'"
"$EXPORT" "$SCRATCH/runs/gpt2gqa" "$SCRATCH/gqa.safetensors" >"$SCRATCH/gqa2.out" 2>&1
check "  ... while its plain safetensors export works (exit $?)" test $? -eq 0
"$EXPORT" "$SCRATCH/nope.h5" "$SCRATCH/x.safetensors" >"$SCRATCH/r1.out" 2>&1
check "a missing input: exit 2 (got $?)" test $? -eq 2
mkdir "$SCRATCH/empty"
"$EXPORT" "$SCRATCH/empty" "$SCRATCH/x.safetensors" >"$SCRATCH/r2.out" 2>&1
check "a directory without checkpoints: exit 2 (got $?)" test $? -eq 2
"$EXPORT" "$SCRATCH/llama.out" "$SCRATCH/x.safetensors" >"$SCRATCH/r3.out" 2>&1
check "a file that is no checkpoint: exit 2 (got $?)" test $? -eq 2
"$EXPORT" "$RUN" >"$SCRATCH/r4.out" 2>&1
check "no output named: exit 2 (got $?)" test $? -eq 2
"$EXPORT" --help >"$SCRATCH/help.out" 2>&1
rc=$?
check "--help (exit $rc) shows --hf, the inputs and examples" \
  sh -c "test $rc -eq 0 && grep -q -- '--hf DIR' '$SCRATCH/help.out' && grep -q 'latest' '$SCRATCH/help.out' &&
         grep -q '^examples:' '$SCRATCH/help.out'"

mkdir "$SCRATCH/moved"
cp "$RUN/ckpt/step_00000002.h5" "$SCRATCH/moved/"
(cd / && "$EXPORT" "$SCRATCH/moved/step_00000002.h5" --hf "$SCRATCH/hf_moved") >"$SCRATCH/m1.out" 2>&1
rc=$?
check "a moved checkpoint exports (exit $rc), naming its stored tokenizer, with a warning that the model file was not found" \
  sh -c "test $rc -eq 0 && grep -q \"warning: the checkpoint names tokenizer 'spm:fortunes' but its shards are not found\" '$SCRATCH/m1.out' &&
         grep -q 'tokenizer spm:fortunes' '$SCRATCH/m1.out' && test ! -e '$SCRATCH/hf_moved/tokenizer.model'"
(cd / && "$EXPORT" "$SCRATCH/moved/step_00000002.h5" --hf "$SCRATCH/hf_moved" \
  --tokenizer-model "$CORPUS/fortunes.model") >"$SCRATCH/m2.out" 2>&1
rc=$?
check "  ... and with --tokenizer-model (exit $rc) copies it" \
  sh -c "test $rc -eq 0 && cmp -s '$SCRATCH/hf_moved/tokenizer.model' '$CORPUS/fortunes.model' &&
         grep -q 'tokenizer spm:fortunes' '$SCRATCH/m2.out'"

# Damage a /model tensor of the newest checkpoint in place (its checksum no longer fits).
"$PYTHON_REF" - "$RUN/ckpt/step_00000004.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    off = f["model/layers.001.attn.wq.weight"].id.get_offset()
with open(sys.argv[1], "r+b") as f:
    f.seek(off + 64)
    f.write(b"\x7f" * 16)
PY
"$EXPORT" "$RUN/ckpt/step_00000004.h5" "$SCRATCH/x.safetensors" >"$SCRATCH/d1.out" 2>&1
check "a damaged checkpoint named as a file: exit 2 (got $?)" test $? -eq 2
check "  ... naming the tensor" grep -q "error: .*checksum mismatch in /model/layers.001.attn.wq" "$SCRATCH/d1.out"
"$EXPORT" "$RUN/ckpt/latest" "$SCRATCH/x.safetensors" >"$SCRATCH/d2.out" 2>&1
check "  ... or through ckpt/latest: exit 2 (got $?)" test $? -eq 2
"$EXPORT" "$RUN" "$SCRATCH/fallback.safetensors" >"$SCRATCH/d3.out" 2>&1
rc=$?
check "the run directory falls back past it (exit $rc) with a warning" \
  sh -c "test $rc -eq 0 && grep -q 'warning: .*step_00000004.h5.*unusable: checksum mismatch' '$SCRATCH/d3.out' &&
         grep -q 'step_00000002.h5 (the newest usable' '$SCRATCH/d3.out'"
spec=${cases[0]}
run_case llama eval >"$SCRATCH/llama.eval2" 2>&1
check "  ... to the checkpoint tessera eval takes too (step 2)" \
  grep -q "eval .*step_00000002.h5: step 2" "$SCRATCH/llama.eval2"
finish
