#!/usr/bin/env bash
# import_hf.sh — tools/tsr-import and checkpoint.init_from, end to end against transformers
# (tests/ref/hf_import_ref.py, run by a Python with transformers: tests/lib.sh hf_python).
#  - tiny random models saved as sharded safetensors: a LlamaForCausalLM (grouped-query,
#    untied head, rope_theta 500000, rope_scaling llama3, a context of 128) and a
#    GPT2LMHeadModel (tied head, Conv1D); imported, `tessera eval` gives transformers' loss
#    of the same tokens to 1e-5 on one rank and on tp 2 x pp 2 (4 ranks), and `tessera
#    generate` takes the greedy tokens model.generate takes;
#  - a continued pre-training run from the llama import (checkpoint.init_from) on tp 2 x pp
#    2: its first loss is transformers' loss of its first batch, it stops at run.max_steps
#    and, rerun with checkpoint.resume = 'auto' set as well, resumes its own checkpoint
#    (not the import) and continues as a run that never stopped;
#  - export -> import gives back a trained checkpoint's tensors bitwise and its eval loss;
#  - a bf16 model imports exactly (every value a bf16), and a bf16 run keeps it exactly;
#  - --pad-vocab-to adds zero rows: the loss is that of the same model padded in
#    transformers, generate's tokens unchanged;
#  - bad input exits 2 naming the key, the file or the tensor, and publishes nothing.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
"$PYTHON_REF" -c 'import torch, numpy, h5py' >/dev/null 2>&1 ||
  skip "$PYTHON_REF cannot import torch, numpy and h5py"
hf_python
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
bytes_corpus computers
IMPORT="$top_srcdir/tools/tsr-import"
EXPORT="$top_srcdir/tools/tsr-export"
REF="$top_srcdir/tests/ref/hf_import_ref.py"
S=$SCRATCH
hf() { "$HF_PYTHON" "$REF" "$@" 2>"$S/hf.err" || { cat "$S/hf.err"; return 1; }; }
# the runs: 64 tokens a sequence, 2 sequences a micro-batch, evaluations of 2 micro-batches
# (in file order: transformers' side reads the token stream as it is stored)
RUN=("data.train=$S/data/train_*.bin" "data.valid=$S/data/valid_*.bin" data.shuffle=.false. model.seq_len=64
  train.micro_batch=2 train.global_batch=4 run.eval_steps=2 run.eval_every=0 run.log_every=1
  optim.warmup_steps=0 optim.decay=constant optim.lr=1e-3)
tsr() { timeout 120 "$TESSERA" "$@"; }
tsr4() { timeout 180 "$MPIRUN" -np 4 "$TESSERA" "$@"; }
last_val() { "$PYTHON_REF" -c "import json, sys; print(repr([json.loads(l) for l in
  open(sys.argv[1]) if 'val_loss' in l][-1]['val_loss']))" "$1"; }
close() { # close A B TOL: |A - B| <= TOL |B|
  "$PYTHON_REF" -c "import sys; a, b, t = map(float, sys.argv[1:4]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)" "$@"
}

# ---- the models, sharded ----
if ! hf make llama "$S/hf_llama" || ! hf make gpt2 "$S/hf_gpt2"; then
  bad "making the models"
  finish
fi
n=$(find "$S/hf_llama" -name 'model-*-of-*.safetensors' | wc -l)
check "transformers saved the llama as $n safetensors shards with an index" \
  sh -c "test $n -ge 3 && test -f '$S/hf_llama/model.safetensors.index.json'"

for k in llama gpt2; do
  "$IMPORT" "$S/hf_$k" --out "$S/imp_$k" --name $k --seq-len 64 >"$S/imp_$k.out" 2>&1
  check "$k: tsr-import (exit $?) writes $k.h5 and $k.nml" \
    sh -c "test -f '$S/imp_$k/$k.h5' && test -f '$S/imp_$k/$k.nml' && ! ls '$S/imp_$k' | grep -q tmp"
  check "$k: ... one checkpoint and one deck there, the checkpoint of step 0" "$PYTHON_REF" -c '
import os, sys, h5py
d, k = sys.argv[1:3]
files = os.listdir(d)
assert [n for n in files if n.endswith(".h5")] == [k + ".h5"], files
assert [n for n in files if n.endswith(".nml")] == [k + ".nml"], files
with h5py.File(os.path.join(d, k + ".h5"), "r") as f:
    assert int(f.attrs["step"]) == 0 and int(f.attrs["complete"]) == 1, dict(f.attrs)
' "$S/imp_$k" "$k"
  DECK=$S/imp_$k/$k.nml
  ref=$(hf loss "$S/hf_$k" "$S/data/valid_*.bin" 64 2 2)
  tsr eval "$DECK" "${RUN[@]}" run.out_dir="$S/ev1_$k" >"$S/ev1_$k.out" 2>&1
  v1=$(last_val "$S/ev1_$k/eval.jsonl" 2>/dev/null)
  check "$k: tessera eval on 1 rank ($v1) is transformers' loss $ref to 1e-5" close "$v1" "$ref" 1e-5
  tsr4 eval "$DECK" "${RUN[@]}" parallel.tp=2 parallel.pp=2 run.out_dir="$S/ev4_$k" >"$S/ev4_$k.out" 2>&1
  v4=$(last_val "$S/ev4_$k/eval.jsonl" 2>/dev/null)
  check "$k: tessera eval on tp 2 x pp 2 ($v4) is transformers' loss to 1e-5" close "$v4" "$ref" 1e-5
  got=$(tsr generate "$DECK" "${RUN[@]}" run.out_dir="$S/gen_$k" --prompt Hello --tokens 16 \
    --temperature 0 --ids 2>"$S/gen_$k.err")
  want=$(hf generate "$S/hf_$k" "0 72 101 108 108 111" 16 256)
  check "$k: tessera generate's greedy tokens are model.generate's ($got)" test "$got" = "$want"
done
check "llama: the deck keeps rope_scaling llama3, rope_theta 500000 and the context of 128" \
  sh -c "grep -q \"rope_scaling *= 'llama3'\" '$S/imp_llama/llama.nml' &&
         grep -q 'rope_theta *= 500000.0' '$S/imp_llama/llama.nml' &&
         grep -q 'max_positions *= 128' '$S/imp_llama/llama.nml' &&
         grep -q 'rope_original_context *= 64' '$S/imp_llama/llama.nml'"

# ---- continued pre-training from the llama import on tp 2 x pp 2 ----
DECK=$S/imp_llama/llama.nml
CPT=("${RUN[@]}" parallel.tp=2 parallel.pp=2 checkpoint.every_steps=1)
tsr4 "$DECK" "${CPT[@]}" run.max_steps=2 run.out_dir="$S/cpt" >"$S/cpt.out" 2>&1
check "continued pre-training from the import, tp 2 x pp 2: stops at run.max_steps 2 (exit $?)" \
  grep -q "initialised from the weights of $S/imp_llama/llama.h5" "$S/cpt.out"
first=$(metric "$S/cpt/metrics.jsonl" 1 loss)
ref=$(hf loss "$S/hf_llama" "$S/data/train_*.bin" 64 2 2)
check "  ... its first loss ($first) is transformers' loss of that batch ($ref) to 1e-5" \
  close "$first" "$ref" 1e-5
tsr4 "$DECK" "${CPT[@]}" run.max_steps=4 checkpoint.resume=auto run.out_dir="$S/cpt" \
  >"$S/cpt2.out" 2>&1
rc=$?
check "  ... rerun with resume = 'auto' set as well (exit $rc): it resumes its step 2, not the import" \
  sh -c "test $rc -eq 0 && grep -q 'resumed from .*step_00000002.h5 at step 2' '$S/cpt2.out' &&
         grep -q 'init_from is not used' '$S/cpt2.out' && ! grep -q 'initialised from' '$S/cpt2.out'"
tsr4 "$DECK" "${CPT[@]}" run.max_steps=4 run.out_dir="$S/cpt_once" >"$S/cpt_once.out" 2>&1
check "  ... and its steps are those of a run that never stopped" \
  agree_runs "$S/cpt" "$S/cpt_once" 1e-9 4
tsr4 "$DECK" "${CPT[@]}" checkpoint.resume="$S/cpt/ckpt/step_00000002.h5" run.out_dir="$S/x" \
  >"$S/both.out" 2>&1
check "  ... init_from with resume = a file is refused (exit $?)" \
  grep -q "checkpoint.init_from = .* and checkpoint.resume = .* both name weights" "$S/both.out"

# ---- export -> import: the trained checkpoint back, bitwise ----
"$EXPORT" "$S/cpt_once/ckpt/step_00000004.h5" --hf "$S/rt_hf" >"$S/rt_export.out" 2>&1 &&
  "$IMPORT" "$S/rt_hf" --out "$S/rt_imp" --name rt --seq-len 64 >"$S/rt_import.out" 2>&1
check "export --hf of the step-4 checkpoint, then import (exit $?)" test -f "$S/rt_imp/rt.h5"
same_model() { # same_model A.h5 B.h5: the same /model tensors, bitwise
  "$PYTHON_REF" - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    na, nb = sorted(a["model"]), sorted(b["model"])
    bad = [n for n in na if n not in b["model"] or
           not np.array_equal(a["model"][n][...].view(np.uint32), b["model"][n][...].view(np.uint32))]
    print(f"    {len(na)} tensors, {len(bad)} differ {bad[:3]}")
    sys.exit(0 if na == nb and not bad else 1)
PY
}
check "  ... gives back its /model tensors bitwise" \
  same_model "$S/cpt_once/ckpt/step_00000004.h5" "$S/rt_imp/rt.h5"
tsr eval "$DECK" "${RUN[@]}" checkpoint.init_from= \
  checkpoint.resume="$S/cpt_once/ckpt/step_00000004.h5" \
  run.out_dir="$S/rt_ev_a" >/dev/null 2>&1
tsr eval "$S/rt_imp/rt.nml" "${RUN[@]}" run.out_dir="$S/rt_ev_b" >/dev/null 2>&1
a=$(last_val "$S/rt_ev_a/eval.jsonl" 2>/dev/null) b=$(last_val "$S/rt_ev_b/eval.jsonl" 2>/dev/null)
check "  ... and the same eval loss ($a, $b)" sh -c "test -n '$a' && test '$a' = '$b'"
"$EXPORT" "$S/imp_gpt2/gpt2.h5" --hf "$S/rt2_hf" >/dev/null 2>&1 &&
  "$IMPORT" "$S/rt2_hf" --out "$S/rt2_imp" --name rt2 --seq-len 64 >/dev/null 2>&1
check "gpt2: export -> import gives back the transposed and fused tensors bitwise" \
  same_model "$S/imp_gpt2/gpt2.h5" "$S/rt2_imp/rt2.h5"

# ---- bf16 ----
hf make llama "$S/hf_bf16" --dtype bf16 &&
  "$IMPORT" "$S/hf_bf16" --out "$S/imp_bf16" --name bf16 --seq-len 64 >"$S/imp_bf16.out" 2>&1
check "bf16: imported (exit $?), the deck trains in bf16" \
  grep -q "precision *= 'bf16'" "$S/imp_bf16/bf16.nml"
"$HF_PYTHON" - "$S/hf_bf16" "$S/imp_bf16/bf16.h5" <<'PY' 2>/dev/null
import glob, sys, h5py, numpy as np, torch
from safetensors.torch import load_file
src = {}
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    src.update(load_file(f))
with h5py.File(sys.argv[2], "r") as f:
    got = {n: f["model"][n][...] for n in f["model"]}
low = sum(int((x.view(np.uint32) & 0xFFFF).any()) for x in got.values())
e = got["embed.weight"].view(np.uint32)
want = src["model.embed_tokens.weight"].float().numpy().view(np.uint32)
q = got["layers.001.attn.wq.weight"].view(np.uint32)
wq = src["model.layers.1.self_attn.q_proj.weight"].float().numpy().view(np.uint32)
print(f"    {len(got)} tensors, {low} with bits below bf16's")
sys.exit(0 if low == 0 and np.array_equal(e, want) and np.array_equal(q, wq) else 1)
PY
check "  ... every value is the source's bf16, widened exactly" test $? -eq 0
tsr "$S/imp_bf16/bf16.nml" "${RUN[@]}" train.precision=bf16 run.max_steps=1 \
  checkpoint.save_initial=.true. run.out_dir="$S/bf16_run" >"$S/bf16_run.out" 2>&1
check "  ... a bf16 run from it (exit $?) starts from exactly those values" \
  same_model "$S/imp_bf16/bf16.h5" "$S/bf16_run/ckpt/step_00000000.h5"

# ---- vocabulary padding ----
hf make llama "$S/hf_v300" --vocab 300 &&
  "$IMPORT" "$S/hf_v300" --out "$S/imp_pad" --name pad --seq-len 64 --pad-vocab-to 128 \
    >"$S/imp_pad.out" 2>&1
check "--pad-vocab-to 128: 300 becomes 384 (exit $?), and the log says so" \
  sh -c "grep -q 'vocabulary padded from 300 to 384' '$S/imp_pad.out' &&
         grep -q 'vocab_size *= 384' '$S/imp_pad/pad.nml'"
ref=$(hf loss "$S/hf_v300" "$S/data/valid_*.bin" 64 2 2 --pad-to 384)
tsr eval "$S/imp_pad/pad.nml" "${RUN[@]}" run.out_dir="$S/ev_pad" >"$S/ev_pad.out" 2>&1
v=$(last_val "$S/ev_pad/eval.jsonl" 2>/dev/null)
check "  ... eval ($v) is transformers' loss with 84 zero rows appended ($ref)" close "$v" "$ref" 1e-5
got=$(tsr generate "$S/imp_pad/pad.nml" "${RUN[@]}" run.out_dir="$S/gen_pad" --prompt Hello \
  --tokens 16 --temperature 0 --ids 2>/dev/null)
want=$(hf generate "$S/hf_v300" "0 72 101 108 108 111" 16 256)
check "  ... generate's greedy tokens are the unpadded model's ($got)" test "$got" = "$want"

# ---- bad input: exit 2, a message naming what is wrong, nothing published ----
# refuses NAME DIR WORDS...: tsr-import DIR exits 2, its error has every WORD (grep -F),
# and its --out directory does not exist afterwards
refuses() {
  local name=$1 dir=$2 out=$S/bad_out
  shift 2
  rm -rf "$out"
  "$IMPORT" "$dir" --out "$out" --seq-len 64 >"$S/bad.out" 2>&1
  local rc=$? ok=1 w
  for w in "$@"; do grep -qF -- "$w" "$S/bad.out" || ok=0; done
  if [ $rc -eq 2 ] && [ $ok -eq 1 ] && [ ! -e "$out" ]; then
    ok "$name: exit 2 naming $*; nothing published"
  else
    bad "$name: exit $rc, wanted 2 and a message naming $*; out dir left: $(ls "$out" 2>&1)"
    cat "$S/bad.out"
  fi
}
variant() { rm -rf "$S/v" && cp -r "$S/hf_llama" "$S/v"; }
config() { # config 'PYTHON EXPRESSION on c': edit $S/v/config.json
  "$PYTHON_REF" -c "import json, sys; c = json.load(open(sys.argv[1])); $1
json.dump(c, open(sys.argv[1], 'w'))" "$S/v/config.json"
}
variant && config "c['architectures'] = ['MistralForCausalLM']; c['model_type'] = 'mistral'"
refuses "another architecture" "$S/v" "architectures" "MistralForCausalLM"
variant && config "c['qk_norm'] = True"
refuses "qk-norm" "$S/v" "qk_norm"
variant && config "c['attention_bias'] = True"
refuses "attention_bias" "$S/v" "attention_bias"
variant && config "c['mlp_bias'] = True"
refuses "mlp_bias" "$S/v" "mlp_bias"
variant && config "c['rope_scaling'] = {'rope_type': 'yarn', 'factor': 4.0}"
refuses "rope_scaling yarn" "$S/v" "rope_scaling.rope_type" "yarn"
rm -rf "$S/pickle" && mkdir "$S/pickle" && cp "$S/hf_llama/config.json" "$S/pickle/"
"$PYTHON_REF" - "$S/pickle/pytorch_model.bin" "$S/pickle/UNPICKLED" <<'PY'
import os, pickle, sys
class Trap:
    def __reduce__(self):
        return (os.system, (f"touch {sys.argv[2]}",))
pickle.dump(Trap(), open(sys.argv[1], "wb"))
PY
refuses "only pytorch_model.bin" "$S/pickle" "pytorch_model.bin" "never"
check "  ... and it was not unpickled" test ! -e "$S/pickle/UNPICKLED"
variant && rm "$S/v/model-00002-of-00006.safetensors"
refuses "a missing shard" "$S/v" "model-00002-of-00006.safetensors" "missing"
# header edits: shard 1's header re-written by a Python expression on h (its entries)
shard1=$S/v/model-00001-of-00006.safetensors
header() { # header 'EXPRESSION on h'
  "$PYTHON_REF" - "$shard1" "$1" <<'PY'
import json, struct, sys
path = sys.argv[1]
raw = open(path, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
h = json.loads(raw[8:8 + n])
names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
exec(sys.argv[2])
text = json.dumps(h).encode()
open(path, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
}
two_d() { # the first 2-D, non-square tensor of shard 1
  "$PYTHON_REF" -c "import json, struct, sys; raw = open(sys.argv[1], 'rb').read()
(n,) = struct.unpack('<Q', raw[:8]); h = json.loads(raw[8:8 + n])
print(next(k for k in sorted(h) if k != '__metadata__' and len(h[k]['shape']) == 2 and
           h[k]['shape'][0] != h[k]['shape'][1]))" "$shard1"
}
variant
t=$(two_d)
header "h['$t']['shape'] = h['$t']['shape'][::-1]"
refuses "a tensor of the wrong shape" "$S/v" "model-00001-of-00006.safetensors" "$t" "shape"
variant && truncate -s -100 "$shard1"
refuses "a truncated file" "$S/v" "model-00001-of-00006.safetensors" "outside the file"
variant && "$PYTHON_REF" -c "import os, struct, sys; f = open(sys.argv[1], 'r+b')
f.write(struct.pack('<Q', os.path.getsize(sys.argv[1]) + 1000))" "$shard1"
refuses "a header length past the end" "$S/v" "model-00001-of-00006.safetensors" "header length"
variant && header "a, b = names[0], names[1]; h[b]['data_offsets'] = [h[a]['data_offsets'][0], h[a]['data_offsets'][0] + h[b]['data_offsets'][1] - h[b]['data_offsets'][0]]"
refuses "overlapping data offsets" "$S/v" "model-00001-of-00006.safetensors" "overlap"
variant && header "h[names[0]]['dtype'] = 'Q7'"
refuses "an unknown dtype" "$S/v" "model-00001-of-00006.safetensors" "unknown dtype 'Q7'"
finish
