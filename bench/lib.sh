# shellcheck shell=bash
# bench/lib.sh — what the MPI benchmarks (zero.sh, tp.sh, pp.sh) share, sourced after they
# set TESSERA and STEPS: MPI as root with one thread per rank, a scratch directory $W
# removed on exit, $here = the source tree, and byte-level token shards of four fortune
# files in $W/data.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
W=$(mktemp -d /tmp/tsr-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
here=$(cd "$(dirname "$0")/.." && pwd)
cat /usr/share/games/fortunes/{computers,science,wisdom,literature} >"$W/text.txt"
"$here/tools/tsr-prepare" --out "$W/data" --tokenizer bytes "$W/text.txt" >/dev/null
