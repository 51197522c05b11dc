#!/usr/bin/env bash
# ckpt_kill.sh — three trials of bench/ckpt_kill.sh: a rank killed (kill -9) at a random
# moment of a background checkpoint write (a random checkpoint, pause point and rank); each
# time the job fails, the checkpoint before the hit one stays the newest complete one, and
# the resumed run ends bitwise equal to an uninterrupted one.  The seed is printed, so a
# failing draw can be repeated: bench/ckpt_kill.sh 3 2 SEED.  About 20 s.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
"$PYTHON_REF" -c "import h5py, numpy" 2>/dev/null || skip "no h5py/numpy in $PYTHON_REF"
seed=${TSR_TEST_SEED:-$(date +%s)}
PYTHON_REF=$PYTHON_REF bash "$top_srcdir/bench/ckpt_kill.sh" 3 2 "$seed" >"$SCRATCH/kill.txt" 2>&1
rc=$?
sed 's/^/    /' "$SCRATCH/kill.txt"
check "3 kill -9 trials (seed $seed): bench/ckpt_kill.sh exits 0 (got $rc)" test $rc -eq 0
check "  ... and every trial resumed and ended bitwise equal" \
  grep -q "^3 of 3 trials resumed from the previous complete checkpoint (or the seed) and ended bitwise equal$" \
  "$SCRATCH/kill.txt"
finish
