#!/usr/bin/env bash
# emu-tessera.sh OUT [PROGRAM.c CPPFLAG...] — link the whole trainer with its CUDA backend (cuda/backend.c, the
# kernels of cuda/*.cu, cuda/select.c) on the CPU emulation of emu/ instead of
# the CUDA runtime: `OUT run.device=cuda ...` then trains with every op going through
# the device backend (managed memory, the stream, scratch, results fetched from "device"
# scalars), kernels run as CPU fibers and cuBLASLt as plain loops, and NCCL
# (cuda/comm_nccl.c) is emulated between the ranks' processes in shared memory.  What it cannot show:
# speed, and races between the host and a real asynchronous GPU.
#
# With PROGRAM.c, that program (a test: tests/cuda/comm_emu.sh) is linked the same way
# instead of src/main.c, compiled with the CPPFLAGs given.
#
# Needs a configured build tree (top_builddir: the libraries of src/, src/cli/embedded_deck.c and
# the Makefile's HDF5/OpenBLAS/OpenMP flags) and top_srcdir.
set -euo pipefail
out=$1
prog=${2:-}
shift $(($# > 1 ? 2 : 1))
top=${top_srcdir:?}
bld=${top_builddir:?}
emu=$top/emu
B=$(mktemp -d "${TMPDIR:-/tmp}/tsr-emu-tessera.XXXXXX")
trap 'rm -rf "$B"' EXIT
mkvar() { sed -n "s/^$1 = //p" "$bld/Makefile" | head -1; }
read -r -a HDF5_CFLAGS <<< "$(mkvar HDF5_CFLAGS)"
read -r -a HDF5_LIBS <<< "$(mkvar HDF5_LIBS)"
read -r -a BLAS_LIBS <<< "$(mkvar OPENBLAS_LIBS)"
read -r -a SPM_LIBS <<< "$(mkvar SPM_LIBS)"
read -r -a OMP <<< "$(mkvar OPENMP_CFLAGS)"
CC=$(mkvar CC)
# the trainer's libraries, highest layer first (Makefile.am's TSR_LIBS)
read -r -a LIBS <<< "$(MAKEFLAGS= make -s --no-print-directory -C "$bld" print-tsr-libs 2>/dev/null)"
make -C "$bld" "${LIBS[@]}" src/cli/embedded_deck.c >/dev/null
CFLAGS=(-std=gnu11 -O2 -g "${OMP[@]}" -Wall -I"$emu/include" -I"$top/src" -I"$bld/src" -I"$top/cuda"
        "${HDF5_CFLAGS[@]}")
. "$emu/kernels.sh"
emu_kernels "$B" & kernels=$!
$CC "${CFLAGS[@]}" -c "$top/cuda/select.c" -o "$B/select.o"
$CC "${CFLAGS[@]}" -c "$top/cuda/context.c" -o "$B/context.o"
# cuDNN attention's path with stand-in graphs (emu/sdpa_fake.c)
$CC "${CFLAGS[@]}" -DTSR_HAVE_CUDNN -c "$top/cuda/backend.c" -o "$B/backend.o"
$CC "${CFLAGS[@]}" -c "$emu/sdpa_fake.c" -o "$B/sdpa_fake.o"
$CC "${CFLAGS[@]}" -c "$top/cuda/comm_nccl.c" -o "$B/comm_nccl.o"
$CC "${CFLAGS[@]}" -c "$top/cuda/comm_stage.c" -o "$B/comm_stage.o"
if [ -n "$prog" ]; then
  $CC "${CFLAGS[@]}" -I"$top/tests" "$@" -c "$prog" -o "$B/main.o"
  : >"$B/embedded_deck.c"
else
  $CC "${CFLAGS[@]}" -DTSR_LINK_CUDA -DTSR_HAVE_NCCL -c "$top/src/main.c" -o "$B/main.o"
  $CC "${CFLAGS[@]}" -c "$top/src/cli/deckpath.c" -o "$B/deckpath.o" # decks by name, no prefix
  cp "$bld/src/cli/embedded_deck.c" "$B/embedded_deck.c"
fi
$CC "${CFLAGS[@]}" -c "$B/embedded_deck.c" -o "$B/embedded_deck.o"
wait "$kernels"
MAIN_OBJS=()
[ -n "$prog" ] || MAIN_OBJS=("$B/deckpath.o")
$CC "${OMP[@]}" -rdynamic -o "$out" "$B/main.o" "${MAIN_OBJS[@]}" "$B/embedded_deck.o" "$B/backend.o" "$B/context.o" "$B/comm_nccl.o" "$B/comm_stage.o" "$B/select.o" \
  "$B/sdpa_fake.o" \
  "${EMU_OBJS[@]/#/$B/}" "${LIBS[@]/#/$bld/}" \
  "${SPM_LIBS[@]}" "${HDF5_LIBS[@]}" "${BLAS_LIBS[@]}" -lstdc++ -lpthread -lrt -lm
