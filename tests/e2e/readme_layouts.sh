#!/usr/bin/env bash
# readme_layouts.sh — README.md's blocks on training, output, sampling and planning, run as
# written (tests/lib.sh readme_block) in a scratch directory set up as the top of a source
# tree (readme_tree: the tree's tools/, input/, jobs/, the built trainer as src/tessera and
# as `tessera` on PATH, the shared fortunes corpus as data/fortunes).  Only appended
# overrides change them: every training run stops after a few steps, with one validation
# batch, and the runs of the layout blocks each start afresh (checkpoint.resume=none)
# rather than resume one another.  In order, each on what the blocks before it wrote:
#   layouts       the five mpirun lines of "Parallel layouts" (4, 8, 2, 2 and 2 ranks)
#   zero          the two mpirun lines of "Data parallelism and ZeRO" (4 ranks)
#   plot          tsr-plot on out/tiny, on two metrics files, on two run directories
#   generate      tessera generate twice on out/tiny's checkpoint, then training with a
#                 sample line
#   plan          the eight `tessera plan` lines of "Planning a run"
#   plan-cpu      `mpirun -np 2 tessera plan ... --hardware cpu`
#   ckpt-inspect  ls, h5dump and tessera eval of the runbook's "Resume from a chosen
#                 checkpoint", on an out/smoke of 30 steps trained here
#   metrics-read  the runbook's grep and python3 on out/smoke/metrics.jsonl
# Each block must exit 0 under bash -eu -o pipefail; the checks after it look at what it
# wrote.  Exit 0 pass, 1 fail, 77 skip.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
corpus
command -v h5dump >/dev/null || skip "no h5dump (apt-get install hdf5-tools)"
export OMPI_MCA_mpi_yield_when_idle=1
W=$SCRATCH/top
readme_tree "$W"
TRAIN='(^|[ /])tessera input/'
SHORT='run.max_steps=2 run.eval_steps=1 checkpoint.resume=none'

# ---- Parallel layouts, ZeRO ----
runs_done() { # runs_done NAME: each mpirun line of the block trained its 2 steps
  local n d
  n=$(grep -c '^mpirun ' "$SCRATCH/$1.sh")
  d=$(grep -c '^done: 2 steps' "$SCRATCH/$1.sh.out")
  check "  ... each of its $n runs trained its 2 steps ($d)" test "$n" -gt 0 -a "$d" = "$n"
}
readme_block layouts "$SCRATCH/layouts.sh" "$TRAIN" "$SHORT" &&
  readme_run layouts "$W" "$SCRATCH/layouts.sh"
runs_done layouts
readme_block zero "$SCRATCH/zero.sh" "$TRAIN" "$SHORT" && readme_run zero "$W" "$SCRATCH/zero.sh"
runs_done zero
grep '^grid:\|^  *dp .* tp .* pp' "$SCRATCH/layouts.sh.out" | head -n 5 | sed 's/^/    /'

# ---- tsr-plot, on the runs above and copies of their history ----
mkdir -p "$W/a" "$W/b" "$W/out/a" "$W/out/b"
head -n 8 "$W/out/tiny/metrics.jsonl" >"$W/a/metrics.jsonl"
tail -n +9 "$W/out/tiny/metrics.jsonl" >"$W/b/metrics.jsonl"
cp "$W/out/tiny/metrics.jsonl" "$W/out/a/"
cp "$W/out/tiny/metrics.jsonl" "$W/out/b/"
if readme_block plot "$SCRATCH/plot.sh"; then
  readme_run plot "$W" "$SCRATCH/plot.sh"
  for f in out/tiny/plots.png run.png compare.png; do
    check "  ... it drew $f" test -s "$W/$f"
  done
fi

# ---- tessera generate ----
if readme_block generate "$SCRATCH/generate.sh" "$TRAIN" 'run.max_steps=4 run.sample_every=2 run.eval_steps=1'; then
  readme_run generate "$W" "$SCRATCH/generate.sh"
  check "  ... the training run logged a sample line" grep -q '^sample: ' "$SCRATCH/generate.sh.out"
fi

# ---- tessera plan ----
if readme_block plan "$SCRATCH/plan.sh"; then
  readme_run plan "$W" "$SCRATCH/plan.sh"
  n=$(grep -c '^predicted step' "$SCRATCH/plan.sh.out")
  check "  ... its tables predicted a step time ($n times)" test "$n" -ge 3
fi
if readme_block plan-cpu "$SCRATCH/plan-cpu.sh"; then
  readme_run plan-cpu "$W" "$SCRATCH/plan-cpu.sh"
fi

# ---- the runbook's look at a run's checkpoints and metrics: an out/smoke of 30 steps ----
(cd "$W" && timeout 300 src/tessera input/tiny.nml run.out_dir=out/smoke run.max_steps=30 \
  train.global_batch=4 checkpoint.every_steps=10 run.eval_every=0 run.eval_steps=1) \
  >"$SCRATCH/smoke.out" 2>&1
check "an out/smoke of 30 steps to look at (exit $?)" test -f "$W/out/smoke/ckpt/step_00000030.h5"
if readme_block ckpt-inspect "$SCRATCH/ckpt-inspect.sh"; then
  readme_run ckpt-inspect "$W" "$SCRATCH/ckpt-inspect.sh"
  check "  ... h5dump printed the checkpoint's step" grep -q '(0): 30' "$SCRATCH/ckpt-inspect.sh.out"
  check "  ... tessera eval wrote out/eval/eval.jsonl" grep -q '"val_loss"' "$W/out/eval/eval.jsonl"
fi
if readme_block metrics-read "$SCRATCH/metrics-read.sh"; then
  readme_run metrics-read "$W" "$SCRATCH/metrics-read.sh"
  check "  ... it printed the last 3 steps, 28 to 30" \
    test "$(grep -cE '^(28|29|30) [0-9.]+ [0-9]+$' "$SCRATCH/metrics-read.sh.out")" = 3
fi
finish
