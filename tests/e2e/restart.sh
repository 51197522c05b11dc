#!/usr/bin/env bash
# restart.sh — restart equivalence (docs/conventions.md "Correctness ladder", level 5), every case
# under a timeout.  The LR schedule is fixed (optim.decay_steps = 20) so it does not depend
# on run.max_steps.  fp32, llama, 4 layers, 4 heads, 2 KV heads: every layout divides.
#  Same layout, bitwise: 20 steps straight  ==  10 steps, stop, resume (auto) to 20: the
#  loss and grad norm of every step are equal as text (17 digits), and the step-20
#  checkpoints hold bitwise equal /model and /optim datasets and equal step / tokens /
#  data_cursor.  Layouts: dp 2 zero 1; tp 2 x pp 2; dp 2 zero 3; hybrid 2 x 2 (4 ranks,
#  ranks_per_node 2, shard_scope node, zero 2).
#  Across layouts, within 1e-5 relative: save under A at step 5, resume that file under B
#  to step 10, compare the losses of steps 6..10 with A straight through (the difference
#  is the summation order of reductions, ~1e-7).  1 -> dp 4; dp 4 -> 1; dp 2 x tp 2 ->
#  pp 4; tp 2 x pp 2 -> dp 2 zero 3; zero 3 -> zero 0; hybrid 2 x 2 -> global dp 2;
#  8 ranks (dp 2 x tp 2 x pp 2, zero 1) -> 4 ranks (tp 2 x pp 2).
#  16-bit storage: bitwise on the same layout in bf16 (dp 2 zero 1; tp 2 x pp 2) and fp16
#  (hybrid, with its loss scale); across layouts in bf16 (1 -> dp 4; dp 2 zero 3 -> pp 4)
#  and fp16 (dp 2 zero 3 -> 1), within 1e-5.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
"$PYTHON_REF" -c "import h5py, numpy" 2>/dev/null || skip "no h5py/numpy in $PYTHON_REF"
bytes_corpus computers
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=4 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=4 optim.lr=1e-2
  optim.warmup_steps=2 optim.decay_steps=20 run.log_every=1000 run.eval_every=0
  "data.train=$SCRATCH/data/train_*.bin" checkpoint.keep=0)
run() { launch -n "$2" -a -o "$1" "${@:3}"; } # run NAME NP overrides... (appends to NAME.out)
# Layouts as NP and overrides.
L_1=(1)
L_dp4=(4 parallel.zero_stage=1)
L_dp2z1=(2 parallel.zero_stage=1)
L_t2p2=(4 parallel.tp=2 parallel.pp=2)
L_dp2z3=(2 parallel.zero_stage=3)
L_dp2z0=(2 parallel.zero_stage=0)
L_hyb=(4 parallel.zero_stage=2 parallel.ranks_per_node=2 parallel.shard_scope=node)
L_d2t2=(4 parallel.tp=2 parallel.zero_stage=1)
L_pp4=(4 parallel.pp=4)
L_8=(8 parallel.tp=2 parallel.pp=2 parallel.zero_stage=1)
# 16-bit storage (b: bf16, f: fp16)
L_dp2z1b=(2 parallel.zero_stage=1 train.precision=bf16)
L_t2p2b=(4 parallel.tp=2 parallel.pp=2 train.precision=bf16)
L_hybf=(4 parallel.zero_stage=2 parallel.ranks_per_node=2 parallel.shard_scope=node
  train.precision=fp16)
L_1b=(1 train.precision=bf16)
L_dp4b=(4 parallel.zero_stage=1 train.precision=bf16)
L_dp2z3b=(2 parallel.zero_stage=3 train.precision=bf16)
L_pp4b=(4 parallel.pp=4 train.precision=bf16)
L_1f=(1 train.precision=fp16)
L_dp2z3f=(2 parallel.zero_stage=3 train.precision=fp16)
layout() { eval "LAY=(\"\${L_$1[@]}\")"; }

compare_py() { "$PYTHON_REF" - "$@" <<'PY'
import json, sys
import h5py, numpy as np
mode = sys.argv[1]
def load(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        if "loss" in d:
            out[d["step"]] = d
    return out
if mode == "metrics-exact":
    a, b = load(sys.argv[2]), load(sys.argv[3])
    steps = range(1, int(sys.argv[4]) + 1)
    bad = [s for s in steps if s not in a or s not in b or
           repr(a[s]["loss"]) != repr(b[s]["loss"]) or repr(a[s]["grad_norm"]) != repr(b[s]["grad_norm"])]
    print(f"    steps 1..{steps[-1]}: {len(bad)} differ{' (first ' + str(bad[0]) + ')' if bad else ''}")
    sys.exit(1 if bad else 0)
if mode == "metrics-close":
    a, b = load(sys.argv[2]), load(sys.argv[3])
    lo, hi, tol = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    steps = range(lo, hi + 1)
    if any(s not in a or s not in b for s in steps):
        print("    missing steps"); sys.exit(1)
    worst = max(abs(a[s]["loss"] - b[s]["loss"]) / abs(a[s]["loss"]) for s in steps)
    print(f"    steps {lo}..{hi}: worst relative loss difference {worst:.2e}")
    sys.exit(0 if worst <= tol else 1)
if mode == "h5-exact":
    fa, fb = h5py.File(sys.argv[2], "r"), h5py.File(sys.argv[3], "r")
    names = []
    fa.visit(lambda n: names.append(n) if isinstance(fa[n], h5py.Dataset) else None)
    other = []
    fb.visit(lambda n: other.append(n) if isinstance(fb[n], h5py.Dataset) else None)
    bad = sorted(set(names) ^ set(other))
    for n in names:
        if n in fb and not np.array_equal(fa[n][...].view(np.uint32), fb[n][...].view(np.uint32)):
            bad.append(n)
    for k in ("step", "tokens", "data_cursor"):
        if fa.attrs[k] != fb.attrs[k]:
            bad.append("@" + k)
    print(f"    {len(names)} datasets compared bitwise, {len(bad)} differ {bad[:3]}")
    sys.exit(1 if bad or not names else 0)
PY
}

# ---- same layout, bitwise ----
for L in dp2z1 t2p2 dp2z3 hyb dp2z1b t2p2b hybf; do
  layout $L
  np=${LAY[0]}
  run "s_$L" "$np" "${LAY[@]:1}" run.max_steps=20 checkpoint.every_steps=5 checkpoint.resume=none
  check "$L: 20 steps straight (exit $?)" test $? -eq 0
  run "h_$L" "$np" "${LAY[@]:1}" run.max_steps=10 checkpoint.every_steps=10 checkpoint.resume=none
  run "h_$L" "$np" "${LAY[@]:1}" run.max_steps=20 checkpoint.every_steps=10 checkpoint.resume=auto
  check "$L: 10 steps, then resume to 20 (exit $?)" test $? -eq 0
  check "$L:   ... resumed at step 10" grep -q "resumed from .*step_00000010.h5 at step 10" "$SCRATCH/h_$L.out"
  compare_py metrics-exact "$SCRATCH/s_$L/metrics.jsonl" "$SCRATCH/h_$L/metrics.jsonl" 20
  check "$L:   ... every step's loss and grad norm bitwise equal to the straight run" test $? -eq 0
  compare_py h5-exact "$SCRATCH/s_$L/ckpt/step_00000020.h5" "$SCRATCH/h_$L/ckpt/step_00000020.h5"
  check "$L:   ... step-20 checkpoints bitwise equal (/model, /optim, step, tokens, cursor)" test $? -eq 0
done

# ---- across layouts: A saves at 5 (and runs on to 10), B resumes A's step 5 ----
straight() { # straight A: A through step 10 with a checkpoint at 5 (reuses the 20-step runs)
  [ -d "$SCRATCH/s_$1" ] && return 0
  layout "$1"
  run "s_$1" "${LAY[0]}" "${LAY[@]:1}" run.max_steps=10 checkpoint.every_steps=5 checkpoint.resume=none
}
cross() { # cross A B
  local a=$1 b=$2
  straight "$a"
  check "$a -> $b: $a straight through (exit $?)" test $? -eq 0
  layout "$b"
  run "x_${a}_$b" "${LAY[0]}" "${LAY[@]:1}" run.max_steps=10 \
    checkpoint.resume="$SCRATCH/s_$a/ckpt/step_00000005.h5"
  check "$a -> $b: $b resumes $a's step 5 and runs to 10 (exit $?)" test $? -eq 0
  check "$a -> $b:   ... resumed at step 5" grep -q "resumed from .*step_00000005.h5 at step 5" \
    "$SCRATCH/x_${a}_$b.out"
  compare_py metrics-close "$SCRATCH/s_$a/metrics.jsonl" "$SCRATCH/x_${a}_$b/metrics.jsonl" 6 10 1e-5
  check "$a -> $b:   ... losses of steps 6..10 equal $a's straight run (rel 1e-5)" test $? -eq 0
}
cross 1 dp4
cross dp4 1
cross d2t2 pp4
cross t2p2 dp2z3
cross dp2z3 dp2z0
cross hyb dp2z1
cross 8 t2p2
cross 1b dp4b
cross dp2z3b pp4b
cross dp2z3f 1f
finish
