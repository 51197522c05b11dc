#!/usr/bin/env bash
# export.sh — tools/tsr-export end to end: train 2 steps on 2 ranks (tp 2, so the file was
# written in pieces), export the checkpoint as fp32 and bf16 safetensors, and read them
# back with an independent reader (header parsed by hand, bytes turned into tensors by
# torch.frombuffer): names and shapes are docs/model.md's /model tensors without the prefix,
# fp32 values equal h5py's bit for bit, bf16 values equal torch's own fp32 -> bf16
# conversion (round-to-nearest-even), metadata carries the step, the model's dimensions,
# the deck and the shards' tokenizer (bytes).  tests/tools/export_hf.sh covers --hf.  h5dump -H shows the
# /model and /optim groups; a missing file is refused with exit code 2.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
"$PYTHON_REF" -c "import torch, h5py, numpy" 2>/dev/null || skip "no torch/h5py/numpy in $PYTHON_REF"
export EXPORT="$top_srcdir/tools/tsr-export"
bytes_corpus computers
timeout 120 "$MPIRUN" -np 2 "$TESSERA" /dev/null model.vocab_size=256 model.n_layer=2 \
  model.d_model=64 model.n_head=4 model.n_kv_head=2 model.d_ff=96 model.seq_len=16 \
  train.micro_batch=1 train.global_batch=2 run.max_steps=2 parallel.tp=2 optim.lr=1e-2 \
  "data.train=$SCRATCH/data/train_*.bin" checkpoint.resume=none run.out_dir="$SCRATCH/run" \
  >"$SCRATCH/run.out" 2>&1
check "training 2 steps on tp 2 (exit $?)" test $? -eq 0
CK="$SCRATCH/run/ckpt/step_00000002.h5"
check "the step-2 checkpoint exists" test -f "$CK"

if command -v h5dump >/dev/null; then
  h5dump -H "$CK" >"$SCRATCH/h5dump.txt" 2>&1
  check "h5dump -H reads the checkpoint (exit $?)" test $? -eq 0
  check "  ... and shows the /model, /optim/m and /optim/v groups" \
    sh -c "grep -q 'GROUP \"model\"' '$SCRATCH/h5dump.txt' && grep -q 'GROUP \"optim\"' '$SCRATCH/h5dump.txt' && grep -q 'GROUP \"m\"' '$SCRATCH/h5dump.txt' && grep -q 'GROUP \"v\"' '$SCRATCH/h5dump.txt'"
  check "  ... and a logical tensor with its full shape" \
    grep -A3 'DATASET "layers.000.attn.wq.weight"' "$SCRATCH/h5dump.txt" -q
else
  echo "    (no h5dump: skipping the h5dump checks)"
fi

"$EXPORT" "$CK" "$SCRATCH/m32.safetensors" >"$SCRATCH/e32.out" 2>&1
check "tsr-export fp32 (exit $?)" test $? -eq 0
"$EXPORT" "$CK" "$SCRATCH/m16.safetensors" --dtype bf16 >"$SCRATCH/e16.out" 2>&1
check "tsr-export bf16 (exit $?)" test $? -eq 0
"$EXPORT" "$SCRATCH/nope.h5" "$SCRATCH/x.safetensors" >"$SCRATCH/enope.out" 2>&1
check "a missing checkpoint is refused with exit code 2 (got $?)" test $? -eq 2

"$PYTHON_REF" - "$CK" "$SCRATCH/m32.safetensors" "$SCRATCH/m16.safetensors" <<'PY'
import json, struct, sys
import h5py, numpy as np, torch
ck, f32, f16 = sys.argv[1:4]
fails = 0
def say(ok, what):
    global fails
    print(("PASS: " if ok else "FAIL: ") + what)
    fails += not ok

def read(path):
    """A minimal safetensors reader: length, JSON header, raw little-endian data."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    head = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    meta = head.pop("__metadata__", {})
    types = {"F32": torch.float32, "BF16": torch.bfloat16}
    out, end = {}, 0
    for name, h in head.items():
        b, e = h["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=types[h["dtype"]]) if e > b else \
            torch.empty(0, dtype=types[h["dtype"]])
        out[name] = (h["dtype"], t.reshape(h["shape"]))
        end = max(end, e)
    return out, meta, len(data) == end, n % 8 == 0

with h5py.File(ck, "r") as f:
    ref = {k: np.asarray(v[...]) for k, v in f["model"].items()}
    step = int(f.attrs["step"])
    n_layer = int(f.attrs["n_layer"])
    dims = {k: int(f.attrs[k]) for k in ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff",
                                         "vocab_size", "seq_len")}
    deck = f.attrs["deck"]
    deck = deck.decode() if isinstance(deck, bytes) else str(deck)

want = ["embed.weight", "final_norm.weight", "lm_head.weight"]
for i in range(n_layer):
    for m in ("attn_norm", "attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp_norm", "mlp.w_gate",
              "mlp.w_up", "mlp.w_down"):
        want.append(f"layers.{i:03d}.{m}.weight")
say(sorted(ref) == sorted(want), f"the checkpoint holds docs/model.md's {len(want)} llama tensors")

for path, dtype in ((f32, "F32"), (f16, "BF16")):
    got, meta, tight, aligned = read(path)
    say(sorted(got) == sorted(ref), f"{dtype}: names are the /model names without the prefix")
    say(all(list(got[k][1].shape) == list(ref[k].shape) for k in ref if k in got),
        f"{dtype}: every shape is the logical shape")
    say(all(got[k][0] == dtype for k in got), f"{dtype}: every dtype is {dtype}")
    say(tight and aligned, f"{dtype}: data offsets cover the data exactly, header 8-byte aligned")
    say(meta.get("step") == str(step) and meta.get("format") == "pt",
        f"{dtype}: __metadata__ has step {step} and format pt")
    say(all(meta.get(k) == str(v) for k, v in dims.items()) and meta.get("arch") == "llama"
        and meta.get("tie_embeddings") == "false" and meta.get("deck") == deck,
        f"{dtype}: __metadata__ has the checkpoint's arch, dimensions and deck")
    say(meta.get("tokenizer") == "bytes" and meta.get("tokenizer_vocab_size") == "256",
        f"{dtype}: __metadata__ names the shards' tokenizer ({meta.get('tokenizer')!r})")
    if dtype == "F32":
        ok = all(np.array_equal(got[k][1].numpy().view(np.uint32), ref[k].view(np.uint32))
                 for k in ref)
        say(ok, "F32: every value is bitwise equal to h5py's")
    else:
        # torch's own fp32 -> bf16 cast rounds to nearest even: an independent reference.
        ok = all(torch.equal(got[k][1].view(torch.int16),
                             torch.from_numpy(ref[k].copy()).to(torch.bfloat16).view(torch.int16))
                 for k in ref)
        say(ok, "BF16: every value equals torch's round-to-nearest-even of the fp32 value")
        worst = max(float((got[k][1].float() - torch.from_numpy(ref[k])).abs().max() /
                          torch.from_numpy(ref[k]).abs().max()) for k in ref)
        say(worst < 2 ** -8, f"BF16: worst error relative to each tensor's max {worst:.2e} < 2^-8")

# Round-to-nearest-even on chosen bit patterns: ties go to even, NaN stays NaN.
import importlib.machinery, importlib.util, os
loader = importlib.machinery.SourceFileLoader("tsr_export", os.environ["EXPORT"])
mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("tsr_export", loader))
loader.exec_module(mod)
pats = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF,
                 0x7F800000, 0x7FC00001, 0x00008000, 0x80018000], dtype=np.uint32)
x = pats.view(np.float32)
mine = mod.fp32_to_bf16_bits(x)
theirs = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
nan = np.isnan(x)
say(np.array_equal(mine[~nan], theirs[~nan]) and np.isnan(
    torch.from_numpy(mine[nan].view(np.int16)).view(torch.bfloat16).float().numpy()).all(),
    "bf16 rounding of ties, carries, overflow to inf, subnormals and NaN matches torch")
sys.exit(1 if fails else 0)
PY
check "the exported files read back correctly (see above)" test $? -eq 0

# Without the shards, the checkpoint's own tokenizer attribute names the tokenizer.
mv "$SCRATCH/data" "$SCRATCH/data.away"
"$EXPORT" "$CK" "$SCRATCH/noshards.safetensors" >"$SCRATCH/enoshards.out" 2>&1
check "tsr-export without the shards (exit $?)" test $? -eq 0
check "  ... names the checkpoint's tokenizer, bytes" "$PYTHON_REF" -c '
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
assert json.loads(blob[8:8 + n])["__metadata__"]["tokenizer"] == "bytes"
' "$SCRATCH/noshards.safetensors"
mv "$SCRATCH/data.away" "$SCRATCH/data"
finish
