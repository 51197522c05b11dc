#!/usr/bin/env bash
# train_e2e.sh — the trainer end to end on the fortunes corpus (small llama):
#  - bitwise resume: 20 steps straight == 10 steps, stop, resume, 10 steps (losses,
#    grad norms and the final checkpoint's tensors identical to the last bit);
#  - save_initial writes step_00000000.h5; `latest` names the newest; keep prunes;
#  - `tessera eval` of a checkpoint reproduces the validation loss logged in training;
#  - a non-finite gradient (fault injected at step 3) skips the update, is counted,
#    and training goes on;
#  - metrics.jsonl: every line is JSON with the documented keys;
#  - the same run under `mpirun -np 1` gives the same losses as the singleton;
#  - the LM head fused with the loss, in chunks, gives the unfused head's losses (fp32,
#    bf16, fp16);
#  - checkpoint.save_last = .false. with no periodic checkpoints writes none and holds no
#    background snapshot (a run that only measures); the default writes the last step's.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
[ -x "$TESSERA" ] || skip "no $TESSERA"
corpus
scratch
COMMON=(model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2 model.d_ff=160
  model.seq_len=64 train.micro_batch=4 train.global_batch=8 optim.lr=3e-3 optim.warmup_steps=5
  optim.decay_steps=20 run.log_every=5 run.eval_every=10 run.eval_steps=2 data.shuffle=.true.
  "data.train=$CORPUS/train_*.bin" "data.valid=$CORPUS/valid_*.bin" checkpoint.keep=2)
DECK="$top_srcdir/input/tiny.nml"

"$TESSERA" "$DECK" "${COMMON[@]}" run.out_dir="$SCRATCH/a" run.max_steps=20 \
  checkpoint.every_steps=5 checkpoint.save_initial=.true. >"$SCRATCH/a.out" 2>&1
check "straight 20-step run exits 0" test $? -eq 0
"$TESSERA" "$DECK" "${COMMON[@]}" run.out_dir="$SCRATCH/b" run.max_steps=10 >"$SCRATCH/b1.out" 2>&1
check "first half (10 steps) exits 0" test $? -eq 0
"$TESSERA" "$DECK" "${COMMON[@]}" run.out_dir="$SCRATCH/b" run.max_steps=20 >"$SCRATCH/b2.out" 2>&1
check "resumed second half exits 0" test $? -eq 0
check "the second half says it resumed from step 10" grep -q "resumed from .*step_00000010.h5 at step 10" "$SCRATCH/b2.out"
same=1
for s in 11 15 20; do
  for k in loss grad_norm; do
    x=$(metric "$SCRATCH/a/metrics.jsonl" $s $k); y=$(metric "$SCRATCH/b/metrics.jsonl" $s $k)
    [ "$x" = "$y" ] && [ "$x" != None ] || { same=0; echo "  step $s $k: straight $x, resumed $y"; }
  done
done
check "steps 11..20 after resume have bitwise the same loss and grad norm" test $same -eq 1
"$PYTHON_REF" - "$SCRATCH/a/ckpt/step_00000020.h5" "$SCRATCH/b/ckpt/step_00000020.h5" <<'PY'
import sys, h5py
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
diff = [n for n in names if a[n][()].tobytes() != b[n][()].tobytes()]  # /tokenizer's u8 too
print(f"  compared {len(names)} datasets bitwise, {len(diff)} differ {diff[:3]}")
sys.exit(1 if diff or len(names) < 10 else 0)
PY
check "final checkpoints (params, Adam m and v) are bitwise identical" test $? -eq 0
check "save_initial wrote step_00000000.h5 (later pruned by keep=2)" grep -q "wrote .*step_00000000.h5" "$SCRATCH/a.out"
check "keep=2 left the two newest checkpoints" \
  test "$(cd "$SCRATCH/a/ckpt" && ls step_*.h5 | tr '\n' ' ')" = "step_00000015.h5 step_00000020.h5 "
check "latest names step_00000020.h5" grep -q "step_00000020.h5" "$SCRATCH/a/ckpt/latest"
check "the step line is printed" grep -Eq "step +20/20 \| loss [0-9.]+ \| lr .* tok/s .* ms .* mem .* ETA" "$SCRATCH/a.out"

"$PYTHON_REF" - "$SCRATCH/a/metrics.jsonl" <<'PY'
import json, sys
keys = {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu", "mem_bytes", "step_ms",
        "skipped", "forward_ms", "backward_ms", "optimizer_ms"}
steps = [json.loads(l) for l in open(sys.argv[1])]
train = [d for d in steps if "loss" in d]
ok = len(train) == 20 and all(keys <= d.keys() for d in train)
# one rank, no pipeline: the three phases are measured and fit inside the step
ok &= all(d["forward_ms"] > 0 and d["backward_ms"] > 0 and d["optimizer_ms"] > 0 and
          d["forward_ms"] + d["backward_ms"] + d["optimizer_ms"] <= d["step_ms"] * 1.001 for d in train)
ok &= [d["step"] for d in train] == list(range(1, 21))
ok &= sum(1 for d in steps if "val_loss" in d) == 2
sys.exit(0 if ok else 1)
PY
check "metrics.jsonl: 20 step lines with every documented key and the phase times, 2 val_loss lines" test $? -eq 0

"$TESSERA" eval "$DECK" "${COMMON[@]}" run.out_dir="$SCRATCH/a" >"$SCRATCH/eval.out" 2>&1
check "tessera eval exits 0" test $? -eq 0
logged=$(metric "$SCRATCH/a/metrics.jsonl" 20 val_loss)
evald=$(sed -n 's/.*val loss \([0-9.]*\) over.*/\1/p' "$SCRATCH/eval.out")
"$PYTHON_REF" -c "import sys; sys.exit(0 if abs($logged - $evald) < 1e-6 else 1)" 2>/dev/null
check "eval of step 20 reproduces the logged val loss ($logged vs $evald)" test $? -eq 0


TSR_FAULT=nan_grad_step=3 "$TESSERA" "$DECK" "${COMMON[@]}" run.out_dir="$SCRATCH/c" \
  run.max_steps=6 checkpoint.resume=none >"$SCRATCH/c.out" 2>&1
check "a run with a NaN gradient at step 3 completes" test $? -eq 0
check "the skipped step is reported" grep -q "step 3: non-finite gradient norm; update skipped" "$SCRATCH/c.out"
check "the skip is counted in metrics" test "$(metric "$SCRATCH/c/metrics.jsonl" 6 skipped)" = 1
"$PYTHON_REF" - "$SCRATCH/a/metrics.jsonl" "$SCRATCH/c/metrics.jsonl" <<'PY'
import json, sys
a = {d["step"]: d for d in map(json.loads, open(sys.argv[1])) if "loss" in d}
c = {d["step"]: d for d in map(json.loads, open(sys.argv[2])) if "loss" in d}
# steps 1-3 see the same parameters; step 4 sees the parameters of step 3 (not updated)
ok = a[1]["loss"] == c[1]["loss"] and a[3]["loss"] == c[3]["loss"] and c[4]["loss"] != a[4]["loss"]
sys.exit(0 if ok else 1)
PY
check "the skipped update left the parameters untouched (losses 1-3 equal, 4 differs)" test $? -eq 0

if command -v "${MPIRUN:-mpirun}" >/dev/null; then
  "${MPIRUN:-mpirun}" -np 1 "$TESSERA" "$DECK" "${COMMON[@]}" run.out_dir="$SCRATCH/d" \
    run.max_steps=3 checkpoint.resume=none >"$SCRATCH/d.out" 2>&1
  check "mpirun -np 1 run exits 0" test $? -eq 0
  check "mpirun -np 1 gives the singleton's step-3 loss" \
    test "$(metric "$SCRATCH/d/metrics.jsonl" 3 loss)" = "$(metric "$SCRATCH/a/metrics.jsonl" 3 loss)"
fi

# The LM head fused with the loss in chunks of 100 of the 256 tokens (the last ragged)
# against the unfused head (train.xent_chunk_tokens = 0).  The rows' losses are the same
# sums in the same order; the logits' GEMM, split by other rows, rounds a few logits
# differently in fp32 (measured 1.4e-9 on the losses over 20 steps); in bf16 and fp16 the
# first steps are (nearly) bitwise, later ones drift as any change of rounding makes
# 16-bit runs drift (tests/mpi/tp.sh), so they are held for 5 steps to 2e-4.
for p in fp32 bf16 fp16; do
  n=$([ $p = fp32 ] && echo 20 || echo 5) tol=$([ $p = fp32 ] && echo 1e-6 || echo 2e-4)
  for c in 0 100; do
    "$TESSERA" "$DECK" "${COMMON[@]}" run.out_dir="$SCRATCH/head_${p}_$c" run.max_steps=$n \
      checkpoint.resume=none checkpoint.every_steps=0 train.precision=$p \
      train.xent_chunk_tokens=$c >"$SCRATCH/head_${p}_$c.out" 2>&1 ||
      { tail -5 "$SCRATCH/head_${p}_$c.out"; }
  done
  check "$p: the fused head in chunks of 100 gives the unfused head's losses ($n steps, $tol)" \
    agree_runs "$SCRATCH/head_${p}_100" "$SCRATCH/head_${p}_0" $tol 5
done
# no checkpoint planned: none written, no snapshot for background writes
"$TESSERA" "$DECK" "${COMMON[@]}" run.out_dir="$SCRATCH/nolast" run.max_steps=3 \
  checkpoint.resume=none checkpoint.every_steps=0 checkpoint.save_last=.false. \
  >"$SCRATCH/nolast.out" 2>&1
check "save_last = .false.: the run finishes (exit $?)" grep -q "^done: 3 steps" "$SCRATCH/nolast.out"
check "... and writes no checkpoint" test ! -e "$SCRATCH/nolast/ckpt/step_00000003.h5"
check "... saying none is planned, and holding no host snapshot" sh -c \
  "grep -q '^checkpoint: none planned' '$SCRATCH/nolast.out' && ! grep -q 'host snapshot' '$SCRATCH/nolast.out'"
check "the default writes the last step's checkpoint" test -f "$SCRATCH/head_fp32_0/ckpt/step_00000020.h5"
for f in a.out b2.out c.out; do grep -q "error" "$SCRATCH/$f" && { echo "--- $f"; tail -20 "$SCRATCH/$f"; }; done
finish
