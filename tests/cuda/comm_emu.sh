#!/usr/bin/env bash
# comm_emu.sh — comm's NCCL transport (cuda/comm_nccl.c) without a GPU: tests/test_comm.c
# built with -DTEST_COMM_DEVICE and linked with the CUDA backend on the CPU emulation
# (tests/cuda/emu-tessera.sh; NCCL emulated between the ranks' processes in shared
# memory) runs every check of test_comm, with each rank on its own emulated device, on
# op memory, through NCCL: all-reduce, reduce-scatter and all-gather (even, uneven with
# an empty block, in place), broadcast from every root, device scalars (double, int;
# sum, max, min), non-blocking forms waited in any order and polled with tsr_comm_test,
# next to MPI send/recv in flight at the same time.  On 2, 3 and 4 ranks.
# EMU_NCCL_TRACE shows that NCCL ran the collectives of every group of 2 or more.
# TEST_COMM_TRANSPORT=staged runs the same checks through MPI on pinned host buffers
# (cuda/comm_stage.c), point-to-point included.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
BIN="$SCRATCH/test_comm_dev"
emu_link test_comm "$BIN" "$top_srcdir/tests/test_comm.c" -DTEST_COMM_DEVICE
for np in 2 3 4; do
  rm -f "$SCRATCH/trace"
  EMU_DEVICES=$np EMU_NCCL_TRACE="$SCRATCH/trace" timeout 600 "$MPIRUN" -np $np "$BIN" \
    >"$SCRATCH/out$np" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q '^test_comm: .* 0 failed' "$SCRATCH/out$np"; then
    ok "test_comm through NCCL on $np ranks: $(grep -c '^PASS' "$SCRATCH/out$np") checks"
  else
    grep -v '^PASS' "$SCRATCH/out$np" | tail -20
    bad "test_comm through NCCL on $np ranks (exit $rc)"
  fi
  # every communicator of 2+ ranks ran all five kinds of NCCL call
  check "on $np ranks, NCCL ran the collectives of each group (trace: $(wc -l <"$SCRATCH/trace" 2>/dev/null) communicators)" \
    awk -v np=$np 'NF { n++; for (i = 6; i <= NF; i += 2) if ($i == 0) z++ }
      END { exit !(n >= np && z == 0) }' "$SCRATCH/trace"
  # the same checks through MPI on pinned host copies (cuda/comm_stage.c): collectives,
  # send/recv with tags, a receive of the wrong size; NCCL is not called at all
  rm -f "$SCRATCH/trace"
  EMU_DEVICES=$np EMU_NCCL_TRACE="$SCRATCH/trace" TEST_COMM_TRANSPORT=staged timeout 600 \
    "$MPIRUN" -np $np "$BIN" >"$SCRATCH/staged$np" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q '^test_comm: .* 0 failed' "$SCRATCH/staged$np" &&
     grep -q '^PASS.*mpi-staged attached' "$SCRATCH/staged$np"; then
    ok "test_comm through staged MPI on $np ranks: $(grep -c '^PASS' "$SCRATCH/staged$np") checks"
  else
    grep -v '^PASS' "$SCRATCH/staged$np" | tail -20
    bad "test_comm through staged MPI on $np ranks (exit $rc)"
  fi
  check "on $np ranks, staged MPI never called NCCL" test ! -s "$SCRATCH/trace"
done
finish
