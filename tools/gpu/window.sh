#!/usr/bin/env bash
# window.sh — the device plan: everything Tessera checks and measures on a GPU, in two
# calls that fit a short window of GPU time, from a bundle made beforehand on a machine
# without a GPU (tools/gpu/bundle.sh).
#
#   tools/gpu/window.sh BUNDLE OUT CALL [BUDGET_S] [--previous FILE...] [--dry-run]
#
# BUNDLE   bundle.sh's .tar.xz (tessera and the kernel tests with their libraries, the
#          token shards); the GPU machine needs only its driver, CUDA, cuBLAS, cuDNN and
#          NCCL (from the toolkit or Python wheels), python3, and for some parts
#          PyTorch and compute-sanitizer.
# OUT      a folder: results.txt (one line per result, written the moment it is known),
#          summary.txt (the decisions), logs-callN.tgz (every part's log and run output,
#          packed again after each part), all of it kept when the call is cut short.
# CALL     1: kernel tests against the CPU (our attention kernels, fp32-arithmetic and
#             mma.sync, and cuDNN's); the trainer against the CPU (one step in fp32,
#             bf16, fp16; mma.sync and cuDNN attention; 50 bf16 steps); llama1b step
#             times for each attention at micro-batch 1 and at the largest micro-batch
#             that fits, and at micro-batch 1 with the optimizer offloaded (against
#             the planner's prediction in bench/RESULTS.md), and at that largest
#             micro-batch with the activation offload; PyTorch eager on the same
#             model; then, if the budget allows,
#             one per-op profile of llama1b (TSR_CUDA_PROFILE) with the attention the
#             summary chose.  At most 7 minutes.
#          2: compute-sanitizer memcheck over 2 bf16 steps; torch.compile; racecheck
#             over the attention kernel tests with the rest of the budget (reporting
#             how many checks it covered when the budget ends first).  At most 4 minutes.
# BUDGET_S seconds for the whole call (default 400 for call 1, 240 for call 2): the parts
#          run in priority order, each under its own limit cut to what is left of the
#          budget; a part that would get under 20 s is skipped and says so.  A part that
#          runs out of time is killed with what it started; the results before it stay.
# --previous FILE...  earlier calls' results.txt, read into this call's summary.
# TW_LIMIT_<part>=S in the environment sets that part's own limit (info, kernels, train,
# llama, torch, profile; memcheck, racecheck, compile); 0 leaves the part out.
# TW_CURVE_STEPS=N: the train part's bf16 curve over N steps (50; 3 in a dry run).
# --dry-run  the rehearsal without a GPU: the bundle is bundle.sh --emu's (the same
#          programs on the CPU emulation of the CUDA runtime), every part runs with tiny
#          shapes and few steps, each part with three times its limit, PyTorch on the
#          CPU, and compute-sanitizer's place is
#          taken by a stand-in that runs the program bare and reports by its exit status
#          (what is rehearsed is the plan's plumbing, not the sanitizer).
#
# Exit status: 0 when every part ran to its end (the decisions may still say FAIL),
# 1 otherwise, 2 on bad arguments.
set -u
SELF=$(cd -P "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
TOP=$(cd "$(dirname "$SELF")/../.." && pwd)
PY=${PYTHON:-python3}

# ---------------------------------------------------------------- the parts, one process each
# (window.sh --part NAME, with the settings in the environment: timeout kills its group)
note() { # note KIND key=value ...: a result line, on stdout and in results.txt at once
  echo "$*"
  echo "$*" >>"$TW_OUT/results.txt"
}
tess() { "$TW_DIR/rt/run.sh" tessera "$@"; }
# one NAME DECK DEVICE ARGS...: a training run into runs/NAME (output NAME.out), its exit
# status returned
one() {
  local name=$1 deck=$2 dev=$3
  shift 3
  tess "$TOP/input/$deck.nml" "data.train=$TW_DIR/data/train_*.bin" \
    "data.valid=$TW_DIR/data/valid_*.bin" checkpoint.every_steps=0 checkpoint.resume=none \
    checkpoint.every_minutes=0 checkpoint.save_last=.false. \
    run.eval_every=0 run.log_every=1 run.device="$dev" run.out_dir="$TW_DIR/runs/$name" \
    "$@" >"$TW_DIR/runs/$name.out" 2>&1
}
# the tiny deck, shrunk further in a dry run; llama1b on one GPU, likewise
TINY=()
LLAMA=(parallel.tp=1 parallel.pp=1 parallel.zero_stage=0 train.precision=bf16)
if [ "${TW_DRY:-0}" = 1 ]; then
  TINY=(model.n_layer=1 model.d_model=64 model.d_ff=128 model.seq_len=32 train.micro_batch=2
    train.global_batch=2)
  LLAMA+=(model.n_layer=1 model.d_model=64 model.n_head=2 model.n_kv_head=1 model.d_ff=128
    model.vocab_size=256 model.seq_len=32 train.xent_chunk_tokens=32)
fi

part_info() {
  local tree
  tree=$(sed -n 's/^tree //p' "$TW_DIR/MANIFEST")
  if [ "${TW_DRY:-0}" = 1 ]; then
    note gpu name="CPU_emulation_(dry_run)" total_mib=0 free_mib=0 driver=none tree="$tree"
  else
    local q
    q=$(nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version \
      --format=csv,noheader,nounits | head -1)
    IFS=, read -r name total free driver <<<"$q"
    note gpu name="$(echo $name | tr ' ' _)" total_mib=${total// /} free_mib=${free// /} \
      driver=${driver// /} tree="$tree"
    nvidia-smi
  fi
  cat "$TW_DIR/MANIFEST"
  command -v nvcc >/dev/null && nvcc --version | tail -2
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version | head -2
  "$PY" -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1
  echo "extra library folders: ${TSR_EXTRA_LIBS:-none}"
  # the FLOPs of a llama1b token as the planner counts them (MFU's numerator)
  tess plan "$TOP/input/llama1b.nml" --nodes 1 --gpus-per-node 1 "${LLAMA[@]}" \
    train.micro_batch=1 train.global_batch=1 >"$TW_DIR/runs/plan_llama1b.out" 2>&1
  "$PY" - "$TW_DIR/runs/plan_llama1b.out" <<'PY' >>"$TW_OUT/results.txt"
import re, sys
t = open(sys.argv[1]).read()
tok = float(re.search(r"compute per step \(([0-9.e+-]+) M tokens\)", t).group(1)) * 1e6
fl = float(re.search(r"model FLOPs\s+([0-9.e+-]+) PFLOP", t).group(1)) * 1e15
print(f"model name=llama1b flops_per_token={fl / tok:.6e}")
PY
  tail -1 "$TW_OUT/results.txt"
}

part_kernels() {
  local only=()
  # the rehearsal's emulated kernels: one family of each kind, not the minutes of all
  [ "${TW_DRY:-0}" = 1 ] && only=(env TSR_TEST_ONLY=xent,optim)
  local rc=0
  "${only[@]}" "$TW_DIR/rt/run.sh" test_kernels >"$TW_DIR/runs/kernels.out" 2>&1 || rc=$?
  cat "$TW_DIR/runs/kernels.out"
  local p f
  p=$(sed -n 's/^test_kernels: \([0-9]*\) checks passed.*/\1/p' "$TW_DIR/runs/kernels.out")
  f=$(sed -n 's/^test_kernels: [0-9]* checks passed, \([0-9]*\) failed.*/\1/p' "$TW_DIR/runs/kernels.out")
  [ -z "$p" ] && p=$(grep -c '^PASS' "$TW_DIR/runs/kernels.out") && f=$(grep -c '^FAIL' "$TW_DIR/runs/kernels.out")
  note kernels passed="$p" failed="$f" rc=$rc cudnn_lines=$(grep -ci cudnn "$TW_DIR/runs/kernels.out")
  # context parallelism's ops on the device (the ring's attention blocks and their merge,
  # against the CPU's): the plan's cp row, from the same run
  note cp_blocks passed="$(grep -c '^PASS: .*attention \(block\|merge\)' "$TW_DIR/runs/kernels.out")" \
    failed="$(grep -c '^FAIL: .*attention \(block\|merge\)' "$TW_DIR/runs/kernels.out")"
}

check() { # check NAME CMD...: a trainer check's result line
  local name=$1 out rc=0
  shift
  out=$("$@" 2>&1) || rc=$?
  echo "$out"
  local detail
  detail=$(echo "$out" | sed -n 's/^RESULT //p' | tail -1)
  note check name="$name" ok=$([ $rc = 0 ] && echo 1 || echo 0) $detail
}
ran_attention() { grep -h -m1 "^attention:" "$TW_DIR/runs/$1.out" | cut -c1-160; }

part_train() {
  local prec tol a steps=${TW_CURVE_STEPS:-50}
  [ "${TW_DRY:-0}" = 1 ] && steps=${TW_CURVE_STEPS:-3}
  for prec in fp32 bf16 fp16; do
    tol=1e-5
    [ $prec != fp32 ] && tol=1e-2
    one "cpu_$prec" tiny cpu "${TINY[@]}" run.max_steps=1 train.precision=$prec
    one "gpu_$prec" tiny cuda "${TINY[@]}" run.max_steps=1 train.precision=$prec
    check "1step_$prec" "$PY" "$TOP/tools/gpu/decide.py" agree "$TW_DIR/runs/gpu_$prec/metrics.jsonl" \
      "$TW_DIR/runs/cpu_$prec/metrics.jsonl" $tol
  done
  for a in mma cudnn; do
    TSR_CUDA_ATTENTION=$a one "gpu_bf16_$a" tiny cuda "${TINY[@]}" run.max_steps=1 train.precision=bf16
    ran_attention "gpu_bf16_$a"
    check "1step_bf16_$a" "$PY" "$TOP/tools/gpu/decide.py" agree \
      "$TW_DIR/runs/gpu_bf16_$a/metrics.jsonl" "$TW_DIR/runs/cpu_bf16/metrics.jsonl" 1e-2
  done
  # cuDNN may decline the tiny deck's head_dim 32: also at head_dim 64, where it must run
  local H64=(model.n_head=2 model.n_kv_head=1)
  one cpu_bf16_hd64 tiny cpu "${TINY[@]}" "${H64[@]}" run.max_steps=1 train.precision=bf16
  TSR_CUDA_ATTENTION=cudnn one gpu_bf16_cudnn64 tiny cuda "${TINY[@]}" "${H64[@]}" \
    run.max_steps=1 train.precision=bf16
  ran_attention gpu_bf16_cudnn64
  check "cudnn_ran_hd64" grep -q "^attention: cuDNN fused flash attention" "$TW_DIR/runs/gpu_bf16_cudnn64.out"
  check "1step_bf16_cudnn_hd64" "$PY" "$TOP/tools/gpu/decide.py" agree \
    "$TW_DIR/runs/gpu_bf16_cudnn64/metrics.jsonl" "$TW_DIR/runs/cpu_bf16_hd64/metrics.jsonl" 1e-2
  one cpu_curve tiny cpu "${TINY[@]}" run.max_steps=$steps train.precision=bf16
  one gpu_curve tiny cuda "${TINY[@]}" run.max_steps=$steps train.precision=bf16
  check "curve_bf16_${steps}steps" "$PY" "$TOP/tools/gpu/decide.py" curve \
    "$TW_DIR/runs/gpu_curve/metrics.jsonl" "$TW_DIR/runs/cpu_curve/metrics.jsonl" $steps
}

# llama NAME ATTN MB STEPS: llama1b on the GPU; its result line
llama() {
  local name=$1 a=$2 mb=$3 n=$4 rc=0 seq=2048 skip=2
  [ "${TW_DRY:-0}" = 1 ] && seq=32 skip=1
  TSR_CUDA_ATTENTION=$a one "$name" llama1b cuda "${LLAMA[@]}" train.micro_batch=$mb \
    train.global_batch=$mb run.max_steps=$n ${TW_LLAMA_EXTRA:-} \
    ${TW_OFFLOAD:+parallel.offload=$TW_OFFLOAD} ${TW_ACT:+train.activation_offload=.true.} || rc=$?
  grep -h "^attention:\|^cuda:\|^step\|error\|^memory" "$TW_DIR/runs/$name.out" | cut -c1-200 | tail -8
  local t="" why="" cud=0
  [ $rc = 0 ] && t=$("$PY" "$TOP/tools/gpu/decide.py" steps "$TW_DIR/runs/$name" $skip $mb $seq)
  grep -q "^attention: cuDNN fused" "$TW_DIR/runs/$name.out" && cud=1
  grep -q "out of device memory" "$TW_DIR/runs/$name.out" && why=out_of_memory
  note llama attn=$a mb=$mb ${TW_OFFLOAD:+offload=$TW_OFFLOAD} ${TW_ACT:+act_offload=1} $t \
    cudnn=$cud rc=$rc ${why:+why=$why} \
    ran="$(ran_attention "$name" | sed 's/^attention: //; s/ [[(].*//' | tr ' ' _)"
  return $rc
}

part_llama() {
  local n=8 big_n=6 a
  [ "${TW_DRY:-0}" = 1 ] && n=3 big_n=2
  for a in mma cudnn; do llama "llama_${a}_mb1" $a 1 $n; done
  # the largest micro-batch the planner fits in this GPU's memory (powers of two); a run
  # out of memory (exit 2) tries half
  local mb=0 m cands="32 16 8 4 2" hbm
  [ "${TW_DRY:-0}" = 1 ] && cands="4 2"
  # this GPU's memory (nvidia-smi's MiB) in the planner's GB
  hbm=$(sed -n 's/^gpu .*total_mib=\([0-9]*\).*/\1/p' "$TW_OUT/results.txt" | tail -1)
  [ "${hbm:-0}" -gt 0 ] && hbm=hardware.hbm_gb=$(awk -v m="$hbm" 'BEGIN{printf "%.1f", m*1.048576/1000}') || hbm=
  for m in $cands; do
    if tess plan "$TOP/input/llama1b.nml" --nodes 1 --gpus-per-node 1 "${LLAMA[@]}" \
      train.micro_batch=$m train.global_batch=$m $hbm \
      --require-fit >"$TW_DIR/runs/plan_mb$m.out" 2>&1; then
      mb=$m
      break
    fi
  done
  echo "largest micro-batch the planner fits: $mb"
  if [ $mb -gt 1 ]; then # cuDNN's and our mma.sync kernels'
    for a in cudnn mma; do
      m=$mb
      while [ $m -gt 1 ]; do
        llama "llama_${a}_mb$m" $a $m $big_n && break
        grep -q "out of device memory" "$TW_DIR/runs/llama_${a}_mb$m.out" || break
        m=$((m / 2))
      done
    done
    echo "$mb" >"$TW_DIR/llama_mb"
  fi
  # the optimizer offload (docs/offload.md): llama1b at micro-batch 1 with the fp32 master
  # and Adam moments in host memory, the host's AdamW on this machine's cores; against
  # the cuDNN mb 1 run above (bench/RESULTS.md has the planner's prediction)
  TW_OFFLOAD=optimizer llama llama_offload_mb1 cudnn 1 $n
  # the activation offload (docs/offload.md): the largest micro-batch's run again with
  # every layer's stored activations through host memory: its step time and memory
  # against the same run without it
  [ $mb -gt 1 ] && TW_ACT=1 llama "llama_actoff_mb$mb" cudnn $mb $big_n
  return 0
}

# torch_run MODE MB STEPS WARM [--compile]: PyTorch on llama1b; its result line
torch_run() {
  local mode=$1 mb=$2 n=$3 w=$4 rc=0
  shift 4
  local tiny=()
  [ "${TW_DRY:-0}" = 1 ] && tiny=(--tiny)
  PYTHONUNBUFFERED=1 "$PY" "$TOP/bench/torch_gpu_llama.py" $n $w --batch $mb "${tiny[@]}" "$@" \
    >"$TW_DIR/runs/torch_${mode}_mb$mb.out" 2>&1 || rc=$?
  tail -4 "$TW_DIR/runs/torch_${mode}_mb$mb.out"
  local line
  line=$(grep "^torch.*median ms/step" "$TW_DIR/runs/torch_${mode}_mb$mb.out" | tail -1)
  note torch mode=$mode mb=$mb rc=$rc $(echo "$line" | sed -n \
    's/.*median ms\/step \([0-9.]*\), tokens\/s \([0-9]*\), model TFLOP\/s \([0-9.]*\), MFU \([0-9.]*\) (peak \([0-9]*\) TFLOP\/s).*max memory \([0-9.]*\) GiB.*/step_ms=\1 tok_s=\2 tflops=\3 mfu=\4 peak_tflops=\5 mem_gb=\6/p')
  return $rc
}

part_torch() {
  local n=8 w=3
  [ "${TW_DRY:-0}" = 1 ] && n=3 w=1
  torch_run eager 1 $n $w || return 1
  local mb m rc
  mb=$(sed -n 's/^llama attn=[a-z]* mb=\([0-9]*\) .*rc=0.*/\1/p' "$TW_OUT/results.txt" | sort -n | tail -1)
  m=${mb:-1}
  while [ "$m" -gt 1 ]; do
    rc=0
    torch_run eager $m $n $w || rc=$?
    [ $rc = 3 ] || break # 3: out of memory
    m=$((m / 2))
  done
}

# compute-sanitizer, or in a dry run its stand-in
sanitizer() {
  if [ "${TW_DRY:-0}" = 1 ]; then echo "$SELF --standin $1"
  else echo "compute-sanitizer --tool $1 --error-exitcode 9"; fi
}

part_memcheck() {
  local rc=0
  TSR_BUNDLE_WRAP="$(sanitizer memcheck)" one san_bf16 tiny cuda "${TINY[@]}" run.max_steps=2 \
    train.precision=bf16 || rc=$?
  grep -h "ERROR SUMMARY\|^done:" "$TW_DIR/runs/san_bf16.out"
  local e
  e=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$TW_DIR/runs/san_bf16.out" | tail -1)
  note sanitizer tool=memcheck what=2_bf16_steps errors="${e:-?}" rc=$rc \
    finished=$(grep -q "^done:" "$TW_DIR/runs/san_bf16.out" && echo 1 || echo 0)
}

part_racecheck() {
  # racecheck is slow (a first run checked 252 attention tests in 220 s without reaching the
  # end): the tests run under a limit of their own, inside the part's, so that a cut-short
  # run still reports how far it got and what it saw
  local rc=0 inner=$((${TW_PART_LIMIT:-60} - 6)) only=()
  [ $inner -lt 10 ] && inner=10
  # the rehearsal's emulated kernels: the head_dim 64 shapes, not the minutes of all
  # (tests/cuda/cuda_emu.sh runs every one)
  [ "${TW_DRY:-0}" = 1 ] && only=(TSR_TEST_HEAD_DIM=64)
  env "${only[@]}" TSR_TEST_ONLY=attention TSR_TEST_NO_CUDNN=1 TSR_BUNDLE_WRAP="$(sanitizer racecheck)" \
    timeout -k 3 $inner "$TW_DIR/rt/run.sh" test_kernels >"$TW_DIR/runs/race.out" 2>&1 || rc=$?
  grep -h "RACECHECK SUMMARY\|^test_kernels:\|Race reported" "$TW_DIR/runs/race.out" | head -20
  local e
  e=$(sed -n 's/.*RACECHECK SUMMARY: \([0-9]*\) hazard.*/\1/p' "$TW_DIR/runs/race.out" | tail -1)
  note sanitizer tool=racecheck what=attention_kernel_tests errors="${e:-?}" rc=$rc \
    finished=$(grep -q "^test_kernels: .* 0 failed" "$TW_DIR/runs/race.out" && echo 1 || echo 0) \
    checks_run=$(grep -c "^PASS" "$TW_DIR/runs/race.out") \
    races_seen=$(grep -c "Race reported" "$TW_DIR/runs/race.out")
}

part_compile() {
  local n=8 w=5
  [ "${TW_DRY:-0}" = 1 ] && n=2 w=1
  local c=(--compile)
  # the CPU's torch of a dry run may predate torch.compile: eager stands in
  [ "${TW_DRY:-0}" = 1 ] && ! "$PY" -c 'import torch; torch.compile' 2>/dev/null && c=()
  torch_run compile 1 $n $w "${c[@]}"
}

part_profile() {
  local a n=4
  [ "${TW_DRY:-0}" = 1 ] && n=2
  a=$(sed -n 's/^DECISION cudnn_default: yes.*/cudnn/p' "$TW_OUT"/summary*.txt 2>/dev/null | head -1)
  TSR_CUDA_PROFILE=1 TSR_CUDA_ATTENTION=${a:-cudnn} one profile_llama1b llama1b cuda \
    "${LLAMA[@]}" train.micro_batch=1 train.global_batch=1 run.max_steps=$n
  local rc=$?
  sed -n '/^cuda profile (TSR_CUDA_PROFILE)/,$p' "$TW_DIR/runs/profile_llama1b.out" | head -45
  note profile what=llama1b_mb1 attn=${a:-cudnn} steps=$n rc=$rc \
    table=$(grep -c "^cuda profile (TSR_CUDA_PROFILE)" "$TW_DIR/runs/profile_llama1b.out")
}

# ---------------------------------------------------------------- subcommands
if [ "${1:-}" = --standin ]; then # --standin TOOL PROGRAM ARGS: compute-sanitizer's place
  tool=$2
  shift 2
  rc=0
  "$@" || rc=$?
  echo "========= (dry run: no compute-sanitizer; the program ran bare and exited $rc)"
  if [ "$tool" = racecheck ]; then
    echo "========= RACECHECK SUMMARY: $([ $rc = 0 ] && echo 0 || echo 1) hazards displayed"
  else
    echo "========= ERROR SUMMARY: $([ $rc = 0 ] && echo 0 || echo 1) errors"
  fi
  exit $rc
fi
if [ "${1:-}" = --part ]; then
  "part_$2"
  exit $?
fi

# ---------------------------------------------------------------- the call
usage() { sed -n '2,40p' "$SELF" >&2; exit 2; }
ARGS=() PREV=() DRY=0
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --previous) shift; while [ $# -gt 0 ] && [[ $1 != --* ]]; do PREV+=("$1"); shift; done; continue ;;
    -h|--help) usage ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
[ ${#ARGS[@]} -ge 3 ] && [ ${#ARGS[@]} -le 4 ] || usage
BUNDLE=${ARGS[0]} OUTD=${ARGS[1]} CALL=${ARGS[2]}
case $CALL in 1) BUDGET=${ARGS[3]:-400} ;; 2) BUDGET=${ARGS[3]:-240} ;; *) usage ;; esac
[ -f "$BUNDLE" ] || { echo "window: no bundle $BUNDLE" >&2; exit 2; }
T0=$(date +%s)
mkdir -p "$OUTD"
export TW_OUT TW_DIR TW_DRY=$DRY PYTHON=$PY
TW_OUT=$(cd "$OUTD" && pwd)
TW_DIR=${TMPDIR:-/tmp}/tsr-window-$CALL
rm -rf "$TW_DIR" && mkdir -p "$TW_DIR/runs" "$TW_DIR/logs"
tar xJf "$BUNDLE" -C "$TW_DIR" || { echo "window: cannot unpack $BUNDLE" >&2; exit 2; }
if grep -q "^emulation yes" "$TW_DIR/MANIFEST" && [ $DRY = 0 ]; then
  echo "window: $BUNDLE is an emulation bundle (bundle.sh --emu): use --dry-run" >&2; exit 2
fi
if grep -q "^emulation no" "$TW_DIR/MANIFEST" && [ $DRY = 1 ]; then
  echo "window: --dry-run needs an emulation bundle (bundle.sh --emu)" >&2; exit 2
fi
# NCCL, cuBLAS, cuDNN and NVRTC of the GPU machine: its toolkit's, or Python wheels'
if [ $DRY = 0 ]; then
  TSR_EXTRA_LIBS=$(find /usr/local /opt /usr/lib -xdev \( -name libnccl.so.2 -o -name \
    libcublasLt.so.13 -o -name libcudnn.so.9 -o -name libnvrtc.so.13 \) 2>/dev/null |
    xargs -r -n1 dirname | sort -u | paste -sd:)
  export TSR_EXTRA_LIBS
else
  export TSR_GEMM_PROBE_N=64 # the emulated MFU probe: a small product
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
echo "# call $CALL, budget ${BUDGET}s, $(date -u +%FT%TZ)$([ $DRY = 1 ] && echo ', dry run')" >>"$TW_OUT/results.txt"

pack() { # every log and run output so far, packed again (what a cut-short call keeps)
  local rc=0
  tar czf "$TW_OUT/logs-call$CALL.tgz.tmp" --exclude='*.h5' -C "$TW_DIR" logs runs 2>/dev/null ||
    rc=$?
  # 1: a file changed while tar read it (a killed part's trainer still writing its last lines
  # and checkpoint after SIGTERM): the archive is whole, that file as it was then
  [ $rc -le 1 ] && mv "$TW_OUT/logs-call$CALL.tgz.tmp" "$TW_OUT/logs-call$CALL.tgz"
}
ALL_OK=1
part() { # part NAME LIMIT_S: run it under min(LIMIT_S, what is left of the budget)
  local name=$1 limit=$2 left rc=0 t1 over
  [ $DRY = 1 ] && limit=$((3 * limit)) # the emulation is slower than any GPU
  over=TW_LIMIT_$name # TW_LIMIT_<part>=S: another limit for that part (0: leave it out)
  limit=${!over:-$limit}
  if [ "$limit" -le 0 ]; then
    note part name=$name skipped="left_out_by_TW_LIMIT_$name"
    ALL_OK=0
    return
  fi
  left=$((BUDGET - ($(date +%s) - T0) - 8))
  if [ $left -lt 20 ]; then
    note part name=$name skipped="${left}s_of_the_budget_left"
    ALL_OK=0
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  t1=$(date +%s.%N)
  echo "=== part $name (limit ${limit}s)"
  TW_PART_LIMIT=$limit timeout -k 5 "$limit" "$SELF" --part "$name" >"$TW_DIR/logs/$name.log" 2>&1 ||
    rc=$?
  tail -30 "$TW_DIR/logs/$name.log"
  note part name=$name rc=$rc s=$(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') \
    limit=$limit
  [ $rc = 0 ] || ALL_OK=0
  pack
}
summarize() {
  "$PY" "$TOP/tools/gpu/decide.py" summary "${PREV[@]}" "$TW_OUT/results.txt" \
    >"$TW_OUT/summary.txt" 2>&1
  echo "=== summary (call $CALL, $(($(date +%s) - T0)) s)"
  cat "$TW_OUT/summary.txt"
}

if [ "$CALL" = 1 ]; then
  part info 40
  part kernels 90
  part train 110
  part llama 150
  part torch 80
  summarize >/dev/null # the profile reads the cuDNN decision
  part profile 45
else
  part info 40
  part memcheck 60
  part compile 100
  part racecheck 240 # what is left of the budget: it took more than 220 s on an H100
fi
summarize
[ $ALL_OK = 1 ]
