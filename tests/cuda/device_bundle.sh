#!/usr/bin/env bash
# device_bundle.sh — tools/device-bundle.sh packs tessera for a GPU machine without MPI,
# HDF5 or OpenBLAS.  Here the bundle runs with an empty environment and the loader told
# to ignore this machine's library cache, so a missing library fails the run:
#  - one rank as an MPI singleton (no mpirun, no daemon) trains and writes its checkpoint;
#  - the bundled mpirun (its daemon through the bundled loader too) runs 2 ranks, and
#    their losses are the single rank's (dp 2 over the same global batch).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
[ -d /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 ] || skip "no Debian Open MPI plugins"
bytes_corpus computers
bash "$top_srcdir/tools/device-bundle.sh" "$SCRATCH/bundle" "$top_builddir/src/tessera-main" \
  >"$SCRATCH/bundle.log" 2>&1
check "the bundle is made" test $? -eq 0 -a -x "$SCRATCH/bundle/run.sh"
C=(model.vocab_size=256 model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2
  model.d_ff=128 model.seq_len=32 train.micro_batch=2 train.global_batch=4 run.log_every=1
  "data.train=$SCRATCH/data/train_*.bin" checkpoint.every_steps=0 checkpoint.resume=none
  run.max_steps=3 run.device=cpu)
bare() { env -i HOME="$SCRATCH" PATH=/bin TMPDIR="${TMPDIR:-/tmp}" "$@"; }
bare timeout 120 "$SCRATCH/bundle/run.sh" tessera /dev/null "${C[@]}" run.out_dir="$SCRATCH/one" \
  >"$SCRATCH/one.out" 2>&1
check "one rank from the bundle, empty environment (exit $?)" test $? -eq 0
check "... wrote its checkpoint" test -f "$SCRATCH/one/ckpt/step_00000003.h5"
bare timeout 180 "$SCRATCH/bundle/run.sh" mpirun -np 2 "$SCRATCH/bundle/run.sh" tessera /dev/null \
  "${C[@]}" run.out_dir="$SCRATCH/two" >"$SCRATCH/two.out" 2>&1
check "2 ranks through the bundled mpirun (exit $?)" test $? -eq 0
check "... with the single rank's losses (dp 2)" "$PYTHON_REF" - "$SCRATCH/one/metrics.jsonl" \
  "$SCRATCH/two/metrics.jsonl" <<'PY'
import json, sys
a, b = ({d["step"]: d["loss"] for d in map(json.loads, open(p)) if "loss" in d} for p in sys.argv[1:3])
assert sorted(a) == sorted(b) == [1, 2, 3], (a, b)
d = max(abs(a[s] - b[s]) / a[s] for s in a)
print(f"    worst relative difference {d:.1e}")
sys.exit(0 if d < 1e-6 else 1)
PY
finish
