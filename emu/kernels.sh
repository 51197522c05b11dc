# kernels.sh (sourced by tests/cuda/emulate.sh and emu-tessera.sh; needs $top, the source
# tree) — emu_kernels DIR: the kernel files cuda/*.cu and the headers they share
# (cuda/*.cuh) turned into C++ for the CPU emulation (transform.py), the headers into DIR
# (where the transformed files find them first) and the kernels compiled, with emu.cpp
# and the NCCL stand-in, in parallel, into DIR/$EMU_OBJS.  The emulation always has cuDNN
# attention's stand-in (sdpa_fake.c), so the kernels see TSR_HAVE_CUDNN.
EMU_KERNELS=(gemm embed norm elem xent optim attention attn_f32 attn_mma)
EMU_OBJS=("${EMU_KERNELS[@]/%/.o}" emu.o nccl.o)
emu_kernels() {
  local dir=$1 emu=$top/emu f h p rc=0 pids=()
  local flags=(-std=c++17 -O2 -g -w -DTSR_HAVE_CUDNN -I"$emu/include" -I"$top/src" -I"$top/cuda")
  # EMU_KERNELS_FROM: a folder where emu_kernels ran before (the same sources): its
  # objects are copied instead of compiled again
  if [ -n "${EMU_KERNELS_FROM:-}" ] && [ -f "$EMU_KERNELS_FROM/emu.o" ]; then
    for f in "${EMU_OBJS[@]}"; do cp "$EMU_KERNELS_FROM/$f" "$dir/$f" || return 1; done
    cp "$EMU_KERNELS_FROM"/*.cuh "$dir/" 2>/dev/null || true
    return 0
  fi
  for h in "$top"/cuda/*.cuh; do
    python3 "$emu/transform.py" "$h" >"$dir/$(basename "$h")" || return 1
  done
  for f in "${EMU_KERNELS[@]}"; do
    { python3 "$emu/transform.py" "$top/cuda/$f.cu" >"$dir/$f.cpp" &&
        g++ "${flags[@]}" -c "$dir/$f.cpp" -o "$dir/$f.o"; } & pids+=($!)
    # two compilers at a time: the emulated attention files take a while each
    if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}" || rc=1; pids=("${pids[@]:1}"); fi
  done
  g++ "${flags[@]}" -c "$emu/emu.cpp" -o "$dir/emu.o" & pids+=($!)
  g++ "${flags[@]}" -c "$emu/nccl.cpp" -o "$dir/nccl.o" & pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
