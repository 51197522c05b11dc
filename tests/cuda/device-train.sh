#!/usr/bin/env bash
# device-train.sh BUNDLE DATA — the whole trainer on a real GPU against its CPU backend, on
# the lent GPU machine (no MPI or HDF5 there: BUNDLE is tools/device-bundle.sh's output,
# DATA a folder of token shards, e.g. the fortunes corpus of tools/fortunes-corpus.sh).
# The same comparisons as tests/cuda_train_emu.sh, plus what only a GPU shows:
#  (a) the tiny deck, one step from the same seed on 'cuda' and 'cpu' in fp32, bf16, fp16:
#      loss and gradient norm agree (fp32 1e-5, bf16/fp16 1e-2 relative);
#  (b) 200 steps of the tiny deck on the GPU track the CPU's curve (every logged loss
#      within 2% of the CPU's, bf16);
#  (c) dp 2 (ZeRO-1), tp 2, pp 2: two ranks sharing the GPU give the CPU's losses;
#  (d) compute-sanitizer memcheck over two steps on the GPU (when it is installed);
#  (e) throughput: tokens/s and MFU of the tiny deck and of llama1b (seq 2048,
#      micro_batch 1, 3 steps) on the GPU, printed for bench/RESULTS.md.
# Prints PASS/FAIL lines and a count (tests/lib.sh); exits 1 on any failure.
set -u
B=$(cd "${1:?usage: device-train.sh BUNDLE DATA}" && pwd)
DATA=$(cd "${2:?usage: device-train.sh BUNDLE DATA}" && pwd)
top=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/tsr-device-train.XXXXXX")
export PYTHON_REF=${PYTHON_REF:-python3} # only json is needed; no Debian python there
top_srcdir=$top
. "$top/tests/lib.sh" # check, finish, agree_runs
T=("$B/run.sh" tessera "$top/input/tiny.nml" "data.train=$DATA/train_*.bin"
  "data.valid=$DATA/valid_*.bin" checkpoint.every_steps=0 checkpoint.resume=none run.eval_every=0)
run() { local name=$1; shift; "${T[@]}" run.out_dir="$W/$name" "$@" >"$W/$name.out" 2>&1; }
agree() { agree_runs "$W/$1" "$W/$2" "$3"; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

for prec in fp32 bf16 fp16; do
  tol=1e-5
  [ $prec != fp32 ] && tol=1e-2
  run "cpu_$prec" run.device=cpu run.max_steps=1 train.precision=$prec
  run "gpu_$prec" run.device=cuda run.max_steps=1 train.precision=$prec
  check "(a) $prec: the GPU run finishes" grep -q "^done:" "$W/gpu_$prec.out"
  check "(a) $prec: one step on the GPU equals the CPU's to $tol" agree "gpu_$prec" "cpu_$prec" $tol
done
grep -h "device:" "$W/gpu_fp32.out"

run cpu_200 run.device=cpu run.max_steps=200 train.precision=bf16
run gpu_200 run.device=cuda run.max_steps=200 train.precision=bf16
check "(b) 200 bf16 steps on the GPU track the CPU curve (2%)" agree gpu_200 cpu_200 2e-2

run2() { # run2 NAME ARGS: two ranks through the bundled mpirun (micro-batches of 8: dp 2
  local name=$1; shift # must divide the deck's global batch of 16)
  "$B/run.sh" mpirun -np 2 "${T[@]}" run.max_steps=5 train.micro_batch=8 run.out_dir="$W/$name" \
    "$@" >"$W/$name.out" 2>&1
}
for L in "dp parallel.zero_stage=1" "tp parallel.tp=2" "pp parallel.pp=2"; do
  set -- $L
  name=$1
  shift
  run2 "cpu_$name" run.device=cpu "$@"
  run2 "gpu_$name" run.device=cuda run.gpu_share=.true. "$@"
  check "(c) $name: 2 ranks on the GPU give the CPU's losses" agree "gpu_$name" "cpu_$name" 1e-5
done

if command -v compute-sanitizer >/dev/null; then
  TSR_BUNDLE_WRAP="compute-sanitizer --tool memcheck --error-exitcode 9" run san run.device=cuda \
    run.max_steps=2
  check "(d) compute-sanitizer memcheck: no errors over 2 steps" grep -q "ERROR SUMMARY: 0 errors" \
    "$W/san.out"
  grep -h "ERROR SUMMARY" "$W/san.out"
fi

run tput run.device=cuda run.max_steps=20 run.log_every=10 train.precision=bf16
grep -h "^step .*/20 " "$W/tput.out" | tail -1
"$B/run.sh" tessera "$top/input/llama1b.nml" "data.train=$DATA/train_*.bin" checkpoint.every_steps=0 \
  checkpoint.resume=none run.eval_every=0 run.max_steps=3 run.log_every=1 run.device=cuda \
  train.micro_batch=1 train.global_batch=1 train.precision=bf16 model.vocab_size=32000 \
  run.out_dir="$W/llama1b" >"$W/llama1b.out" 2>&1
grep -h "^step\|error" "$W/llama1b.out" | tail -3
echo "outputs in $W"
finish
