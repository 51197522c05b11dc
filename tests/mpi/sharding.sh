#!/usr/bin/env bash
# sharding.sh — checkpoints by pieces under any layout (tests/mpi/test_sharding.c) on 1, 2, 3
# and 4 ranks, in one shared directory: each run saves under every grid its rank count
# allows (tp 1/2/4, pp 1/2 x virtual stages 1/2, dp as zero-0 copies, zero shards (3:
# uneven, cut mid-row) or hybrid 2 x 2), loads those files under other grids, and also
# loads every file the runs before it wrote under another rank count.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
BIN="$top_builddir/tests/mpi/test_sharding"
[ -x "$BIN" ] || skip "test_sharding not built"
MPIRUN=${MPIRUN:-mpirun}
command -v "$MPIRUN" >/dev/null || skip "no mpirun"
scratch
for np in 1 2 3 4; do
  timeout 300 "$MPIRUN" -np $np "$BIN" "$SCRATCH" >"$SCRATCH/np$np.out" 2>&1
  rc=$?
  grep -E "^FAIL|checks passed" "$SCRATCH/np$np.out"
  check "test_sharding on $np rank(s)" test $rc -eq 0
done
check "np 4 loaded files written on 1, 2 and 3 ranks" \
  test "$(grep -cE '^ok   np[123] (llama|gpt2)-.* load rc=0' "$SCRATCH/np4.out")" -ge 10
finish
