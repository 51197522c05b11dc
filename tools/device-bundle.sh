#!/usr/bin/env bash
# device-bundle.sh OUT_DIR [TESSERA [PROGRAM...]] — make a CUDA build of tessera (and of
# other programs linked like it: the kernel tests, the kernel benchmark) runnable on a GPU machine
# that has the CUDA toolkit but no MPI, HDF5 or OpenBLAS: copies the binary, its own
# dynamic loader and every shared library it and Open MPI's plugins and launcher need (not
# the CUDA libraries: the GPU machine's own are used), Open MPI's plugins, help texts and
# configuration, into OUT_DIR, with a launcher:
#
#   OUT_DIR/run.sh tessera DECK key=value ...      one rank (an MPI singleton, no daemon)
#   OUT_DIR/run.sh mpirun -np 2 OUT_DIR/run.sh tessera DECK ...   several ranks
#   OUT_DIR/run.sh test_kernels                   a PROGRAM bundled beside it, by its name
#
# run.sh starts the program through the bundled loader with only the bundled libraries
# (and the CUDA ones from CUDA_HOME, default: nvcc's toolkit or /usr/local/cuda), so the
# GPU machine's C library does not matter.  TSR_EXTRA_LIBS: more library folders, searched
# last (where NCCL or cuBLAS live outside CUDA_HOME, e.g. in Python wheels).  About 90 MB;
# `tar cJf OUT_DIR.tar.xz OUT_DIR` packs it into about 20 MB (a minute) to copy over and
# unpack there.  TESSERA: the trainer itself, default src/tessera-main of the build in the
# current directory (src/tessera is its static launcher, which the bundle does not need).
set -euo pipefail
out=${1:?usage: device-bundle.sh OUT_DIR [TESSERA [PROGRAM...]]}
bin=${2:-src/tessera-main}
extra=("${@:3}")
for p in "$bin" "${extra[@]}"; do
  [ -x "$p" ] || { echo "device-bundle: no executable $p" >&2; exit 2; }
  case $(basename "$p") in run.sh|mpirun|root) echo "device-bundle: a program may not be named $(basename "$p")" >&2; exit 2 ;; esac
done
ldd "$bin" | grep -q libcudart || echo "device-bundle: warning: $bin is not linked with CUDA" >&2
ompi=/usr/lib/x86_64-linux-gnu/openmpi
[ -d "$ompi/lib/openmpi3" ] || { echo "device-bundle: no Open MPI plugins in $ompi" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out/root"
R=$(cd "$out/root" && pwd)

# every library the binary, Open MPI's launcher and daemon and its plugins load
progs=("$bin" "${extra[@]}" /usr/bin/orterun /usr/bin/orted "$ompi"/lib/openmpi3/*.so)
libs=$(for p in "${progs[@]}"; do ldd "$p" 2>/dev/null || true; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' | sort -u |
  grep -v -E '/lib(cuda|cudart|cublas|cublasLt|nccl|nvidia|nvrtc|cudnn)[.-]' || true)
for f in $libs; do
  mkdir -p "$R$(dirname "$f")"
  cp -L "$f" "$R$f"
done
loader=$(ldd "$bin" | awk '$1 ~ /^\/.*ld-linux/ {print $1}')
mkdir -p "$R/lib64" && cp -L "$loader" "$R/lib64/ld-linux-x86-64.so.2"
# Open MPI relocated under OPAL_PREFIX=$R/usr: plugins, help texts, configuration
mkdir -p "$R$ompi" "$R/usr/share" "$R/usr/bin" "$R/etc"
cp -a "$ompi/lib" "$R$ompi/"
cp -a /usr/share/openmpi "$R/usr/share/"
[ -d /etc/openmpi ] && cp -a /etc/openmpi "$R/etc/"
# the daemon and launcher run through the bundled loader too
for p in orted orterun; do
  cp -L "/usr/bin/$p" "$R/usr/bin/$p.bin"
  cat >"$R/usr/bin/$p" <<EOF
#!/usr/bin/env bash
exec "\$TSR_BUNDLE_LOADER" --inhibit-cache --library-path "\$TSR_BUNDLE_LIBS" "\$(dirname "\$0")/$p.bin" "\$@"
EOF
  chmod +x "$R/usr/bin/$p"
done
ln -s orterun "$R/usr/bin/mpirun"
cp -L "$bin" "$out/tessera"
for p in "${extra[@]}"; do cp -L "$p" "$out/$(basename "$p")"; done

cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# run.sh PROGRAM ARGS — PROGRAM (tessera, another bundled program, or mpirun) with the
# bundled libraries only.
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
R=$B/root
prog=${1:?usage: run.sh tessera|PROGRAM|mpirun ARGS}
shift
if [ -z "${CUDA_HOME:-}" ]; then
  if command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
  else CUDA_HOME=/usr/local/cuda; fi
fi
M=x86_64-linux-gnu
export TSR_BUNDLE_LOADER=$R/lib64/ld-linux-x86-64.so.2
export TSR_BUNDLE_LIBS=$R/lib/$M:$R/usr/lib/$M:$R/usr/lib/$M/openmpi/lib:$R/usr/lib/$M/hdf5/openmpi:$R/usr/lib/$M/openblas-pthread:$CUDA_HOME/lib64:$CUDA_HOME/lib${TSR_EXTRA_LIBS:+:$TSR_EXTRA_LIBS}
export OPAL_PREFIX=$R/usr PATH=$R/usr/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_ess_singleton_isolated=1 # one rank without mpirun: no daemon to start
case $prog in
  # TSR_BUNDLE_WRAP: a command put in front (compute-sanitizer --tool memcheck, nsys ...)
  tessera) exec ${TSR_BUNDLE_WRAP:-} "$TSR_BUNDLE_LOADER" --inhibit-cache --library-path "$TSR_BUNDLE_LIBS" "$B/tessera" "$@" ;;
  mpirun) exec "$R/usr/bin/mpirun" "$@" ;;
  */* | run.sh | root) echo "run.sh: tessera, a bundled program or mpirun, not '$prog'" >&2; exit 2 ;;
  *) [ -f "$B/$prog" ] && [ -x "$B/$prog" ] ||
       { echo "run.sh: tessera, a bundled program or mpirun, not '$prog'" >&2; exit 2; }
     exec ${TSR_BUNDLE_WRAP:-} "$TSR_BUNDLE_LOADER" --inhibit-cache --library-path "$TSR_BUNDLE_LIBS" "$B/$prog" "$@" ;;
esac
EOF
chmod +x "$out/run.sh"
echo "device-bundle: $out ($(du -sh "$out" | cut -f1)): $(echo "$libs" | wc -w) libraries; run $out/run.sh tessera ..."
