#!/usr/bin/env bash
# bundle.sh [--emu] OUT.tar.xz — what the device plan (tools/gpu/window.sh) runs, made in
# one command from a configured and built tree on a machine without a GPU, packed into
# one file well under 64 MiB:
#   rt/       tools/device-bundle.sh's folder: tessera and tests/cuda/test_kernels with
#             every library they need but the GPU machine's own CUDA, cuBLAS, cuDNN and
#             NCCL (MPI, HDF5, OpenBLAS, SentencePiece, the C library and its loader)
#   data/     token shards of Debian's fortunes (bytes tokenizer, vocabulary 256): enough
#             for llama1b's 2048-token sequences and the tiny deck's comparisons
#   MANIFEST  the tree (git describe), its CUDA targets, whether it is an emulation bundle
# --emu: tessera and test_kernels linked with the CPU emulation of the CUDA runtime
# (emu/emu-tessera.sh, emu/emu-test-kernels.sh) instead, for `window.sh --dry-run`
# here: the same plan, every part, without a GPU.
# Run it in the build tree (or set top_builddir); the source tree is this script's.
set -euo pipefail
emu=0
[ "${1:-}" = --emu ] && { emu=1; shift; }
out=${1:?usage: bundle.sh [--emu] OUT.tar.xz}
top=$(cd -P "$(dirname "$0")/../.." && pwd)
bld=$(cd "${top_builddir:-.}" && pwd)
[ -f "$bld/Makefile" ] || { echo "bundle: $bld is not a configured build tree (./configure first)" >&2; exit 2; }
W=$(mktemp -d "${TMPDIR:-/tmp}/tsr-bundle.XXXXXX")
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/b" "$W/bin"
t0=$(date +%s)
if [ $emu = 1 ]; then
  echo "bundle: linking tessera and test_kernels on the CPU emulation"
  bash "$top/emu/emu-test-kernels.sh" "$W/k" >"$W/emu.log" 2>&1 || { cat "$W/emu.log"; exit 1; }
  EMU_KERNELS_FROM=$W/k top_srcdir=$top top_builddir=$bld bash "$top/emu/emu-tessera.sh" \
    "$W/bin/tessera" >>"$W/emu.log" 2>&1 || { cat "$W/emu.log"; exit 1; }
  cp "$W/k/test_kernels" "$W/bin/"
  arch="none (CPU emulation)"
else
  grep -q '^CUDA_LIBS = .*cudart' "$bld/Makefile" ||
    { echo "bundle: $bld was configured without CUDA" >&2; exit 2; }
  echo "bundle: building tessera (src/tessera-main) and tests/cuda/test_kernels"
  make -C "$bld" -j"$(nproc)" src/tessera-main tests/cuda/test_kernels >"$W/make.log" 2>&1 ||
    { tail -20 "$W/make.log"; exit 1; }
  cp "$bld/src/tessera-main" "$W/bin/tessera"
  cp "$bld/tests/cuda/test_kernels" "$W/bin/"
  arch=$(sed -n 's/^CUDA_ARCH = //p' "$bld/Makefile")
fi
bash "$top/tools/device-bundle.sh" "$W/b/rt" "$W/bin/tessera" "$W/bin/test_kernels" 2>&1 |
  grep -v "is not linked with CUDA" | tail -1
"$top/tools/tsr-prepare" --out "$W/b/data" --tokenizer bytes \
  $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort) |
  tail -1
{
  echo "tree $(git -C "$top" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "emulation $([ $emu = 1 ] && echo yes || echo no)"
  echo "cuda_arch $arch"
  echo "made $(date -u +%FT%TZ) on $(uname -n)"
} >"$W/b/MANIFEST"
mkdir -p "$(dirname "$out")"
XZ_OPT="-6 -T$(nproc)" tar cJf "$out.tmp" -C "$W/b" .
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
echo "bundle: $out, $((size / 1048576)) MiB ($(cat "$W/b/MANIFEST" | head -1)), $(($(date +%s) - t0)) s"
[ "$size" -lt $((48 << 20)) ] || { echo "bundle: $out is over 48 MiB: too large to travel with the tree" >&2; exit 1; }
