# kernels.sh (sourced by tests/cuda/emulate.sh and emu-tessera.sh; needs $top, the source
# tree) — emu_kernels DIR: cuda/*.cu turned into C++ for the CPU emulation (transform.py)
# and compiled, with emu.cpp, in parallel, into DIR/$EMU_OBJS.
EMU_OBJS=(ops_elem.o xent.o attention.o gemm.o emu.o nccl.o)
emu_kernels() {
  local dir=$1 emu=$top/tests/cuda/emu f p rc=0 pids=()
  local flags=(-std=c++17 -O2 -g -w -I"$emu/include" -I"$top/src" -I"$top/cuda")
  for f in ops_elem xent attention gemm; do
    { python3 "$emu/transform.py" "$top/cuda/$f.cu" >"$dir/$f.cpp" &&
        g++ "${flags[@]}" -c "$dir/$f.cpp" -o "$dir/$f.o"; } & pids+=($!)
  done
  g++ "${flags[@]}" -c "$emu/emu.cpp" -o "$dir/emu.o" & pids+=($!)
  g++ "${flags[@]}" -c "$emu/nccl.cpp" -o "$dir/nccl.o" & pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
