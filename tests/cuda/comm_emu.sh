#!/usr/bin/env bash
# comm_emu.sh — comm's device transports without a GPU: tests/test_comm.c built with
# -DTEST_COMM_DEVICE against the CPU emulation of the CUDA runtime and of NCCL
# (emu/; NCCL between the ranks' processes in shared memory) runs every check
# of test_comm, on fp32, bf16 and fp16 data, with each rank on its own emulated device,
# on op memory, through NCCL: all-reduce, reduce-scatter and all-gather (even, uneven
# with an empty block, in place), 16-bit sums that round (within the bound, exactly
# rounded on 2 ranks, bitwise equal on every rank), broadcast from every root, device
# scalars (double, int; sum, max, min), non-blocking forms waited in any order and
# polled with tsr_comm_test, next to MPI send/recv in flight at the same time.  On 2, 3
# and 4 ranks.  EMU_NCCL_TRACE shows that NCCL ran the collectives of every group of 2
# or more, bf16 and fp16 ones among them.  TEST_COMM_TRANSPORT=staged runs the same
# checks through MPI on pinned host buffers (cuda/comm_stage.c), point-to-point included.
#
# The build is comm's own: comm.c, the memory half of ops.c, util.c, watchdog.c,
# cuda/select.c, the two transports and the test's memory-only device (test_comm.c), on
# the emulated runtime and NCCL; neither the trainer nor the kernels are linked.  ops.c's
# op dispatch names the CPU kernels, which comm never calls: -ffunction-sections and
# --gc-sections leave those functions, and their references, out of the link.
# Needs a configured build tree (top_builddir: src/tsr_build.h, the Makefile's CC and
# OpenMP flags) and top_srcdir.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
MPIRUN=${MPIRUN:-mpirun}
command -v "${MPIRUN%% *}" >/dev/null || skip "no $MPIRUN"
command -v g++ >/dev/null || skip "no g++"
[ -f "$top_builddir/src/tsr_build.h" ] || skip "no configured build tree in $top_builddir"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
scratch

mkvar() { sed -n "s/^$1 = //p" "$top_builddir/Makefile" | head -1; }
CC=$(mkvar CC)
read -r -a OMP <<<"$(mkvar OPENMP_CFLAGS)"
emu=$top_srcdir/emu
BIN="$SCRATCH/test_comm_dev"
build() {
  local cflags=(-std=gnu11 -O2 -g "${OMP[@]}" -Wall -Wextra -Wno-unused-parameter
                -ffunction-sections -I"$emu/include" -I"$top_srcdir/src" -I"$top_builddir/src"
                -I"$top_srcdir/cuda" -I"$top_srcdir/tests")
  local cxxflags=(-std=c++17 -O2 -g -w -I"$emu/include" -I"$top_srcdir/src")
  g++ "${cxxflags[@]}" -c "$emu/emu.cpp" -o "$SCRATCH/emu.o" &&
    g++ "${cxxflags[@]}" -c "$emu/nccl.cpp" -o "$SCRATCH/nccl.o" &&
    "${CC:-mpicc}" "${cflags[@]}" -DTEST_COMM_DEVICE -o "$BIN" "$top_srcdir/tests/test_comm.c" \
      "$top_srcdir/src/comm.c" "$top_srcdir/src/ops.c" "$top_srcdir/src/util.c" \
      "$top_srcdir/src/watchdog.c" "$top_srcdir/cuda/select.c" "$top_srcdir/cuda/comm_nccl.c" \
      "$top_srcdir/cuda/comm_stage.c" "$SCRATCH/emu.o" "$SCRATCH/nccl.o" \
      -Wl,--gc-sections -lstdc++ -lpthread -lrt -lm
}
if build >"$SCRATCH/build.log" 2>&1; then
  ok "test_comm linked with comm's transports on the emulated GPU and NCCL"
else
  cat "$SCRATCH/build.log"
  bad "linking test_comm on the emulated GPU"
  finish
fi

for np in 2 3 4; do
  rm -f "$SCRATCH/trace"
  EMU_DEVICES=$np EMU_NCCL_TRACE="$SCRATCH/trace" timeout 600 $MPIRUN -np $np "$BIN" \
    >"$SCRATCH/out$np" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q '^test_comm: .* 0 failed' "$SCRATCH/out$np" &&
     grep -q '^PASS.*nccl attached' "$SCRATCH/out$np"; then
    ok "test_comm through NCCL on $np ranks: $(grep -c '^PASS' "$SCRATCH/out$np") checks"
  else
    grep -v '^PASS' "$SCRATCH/out$np" | tail -20
    bad "test_comm through NCCL on $np ranks (exit $rc)"
  fi
  # every communicator of 2+ ranks ran all five kinds of NCCL call, and some on bf16 and
  # on fp16 (the fields after "rank R of N:" are name / count pairs)
  check "on $np ranks, NCCL ran the collectives of each group, bf16 and fp16 too (trace: $(wc -l <"$SCRATCH/trace" 2>/dev/null) communicators)" \
    awk -v np=$np 'NF { n++; for (i = 6; i <= NF; i += 2) if ($i == 0) z++ }
      END { exit !(n >= np && z == 0) }' "$SCRATCH/trace"
  # the same checks through MPI on pinned host copies (cuda/comm_stage.c): collectives,
  # send/recv with tags, a receive of the wrong size; NCCL is not called at all
  rm -f "$SCRATCH/trace"
  EMU_DEVICES=$np EMU_NCCL_TRACE="$SCRATCH/trace" TEST_COMM_TRANSPORT=staged timeout 600 \
    $MPIRUN -np $np "$BIN" >"$SCRATCH/staged$np" 2>&1
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
