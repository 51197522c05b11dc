#!/usr/bin/env bash
# cuda_train_emu.sh — the trainer on its CUDA backend (run.device = 'cuda', cuda/backend.c)
# without a GPU: emu/emu-tessera.sh links tessera with the CUDA kernels run on the
# CPU emulation (emu/), so every op, copy, fill, scratch use and device-scalar
# fetch of the device path runs, against the CPU backend from the same seed:
#  (a) llama in fp32, bf16 and fp16 (loss scaling), each stored natively on the device
#      (2-byte activations, gradients of activations and weights in bf16 and fp16): the
#      loss and gradient norm of every step agree with run.device = 'cpu' (fp32 to 2e-6,
#      measured 2.4e-9; bf16 and fp16 to 2e-4 on losses and 2e-3 on gradient norms,
#      measured 1.5e-6 / 1.6e-5 and 4.7e-7 / 1.7e-5: the two backends round the same
#      fp32 values once on store, but sum in different orders, so some roundings to 16
#      bits flip); the activations reserved in bf16 are half those of fp32, and the device
#      memory measured after step 1 is within 5% of tessera plan's GPU figure (measured
#      -1.3%; the plan counts cuDNN attention's workspace, the default, in bf16 and not
#      under TSR_CUDA_ATTENTION=mma in fp16); 16-bit attention runs by default on the
#      emulation's stand-in for cuDNN's graphs (the emulation is a build with cuDNN), and
#      with TSR_CUDA_ATTENTION=mma on our kernels: at head_dim 16 the fp32-arithmetic one,
#      at head_dim 32 the mma.sync tensor-core ones, in bf16 and fp16, each to 2e-4
#      (measured at most 3.1e-5, gradient norms 4.4e-4); a shape cuDNN declines takes our
#      kernel, saying why;
#      TSR_CUDA_ATTENTION=wmma (kernels removed) and an unknown value are refused;
#  (b) gpt2 (LayerNorm, GELU, biases, learned positions, tied embeddings), full recompute,
#      the unfused LM head (the other runs take the fused head, xent_head, in chunks of 24
#      of the 64 tokens), with a validation pass, in fp32, bf16 and fp16: training and
#      validation losses
#      agree (fp32 2e-6, measured 3.2e-9; 16-bit 2e-4, measured 6.6e-6, gradient norms
#      1.0e-4);
#  (c) 2 ranks sharing the one emulated GPU (run.gpu_share): dp 2 at ZeRO-3, tp 2 with
#      sequence parallelism, pp 2 on 1F1B, cp 2 by the ring and by the all-to-alls give
#      the CPU's losses (NCCL cannot put two ranks
#      on one GPU, and the log says so; Debian's Open MPI is not CUDA-aware, so the groups
#      go through MPI on pinned host copies, cuda/comm_stage.c, and pp's send/recv too;
#      &parallel mpi_gpu = 'direct', MPI on device memory itself, is refused there);
#  (c') a GPU per rank (EMU_DEVICES): dp 2 at ZeRO-3 and tp 2 with sequence parallelism
#      through NCCL (cuda/comm_nccl.c, emulated), pp 2 through staged MPI, and tp 2 x dp 2
#      on two "nodes" (tp on NCCL, dp across the nodes on staged MPI by default, on NCCL
#      with &parallel inter_node = 'nccl'), give the
#      CPU's losses; the emulated NCCL's trace shows it carried the traffic;
#  (d) restart on the device: 2 steps + resume to 4 equals 4 straight steps bitwise, and
#      the device's checkpoint resumes on the CPU;
#  (f) document masking (data.document_mask, shards of one document per line): llama with
#      head_dim 32 in fp32 and bf16 (cuDNN's attention asked for by default: the masked
#      attention runs on the mma.sync kernels, and the log says why), gpt2 (learned
#      positions restarting at each document: the position gradient's sort) in fp32, and
#      pp 2 on two ranks sharing the GPU, each against the masked CPU run (fp32 2e-6,
#      bf16 2e-4), validation included;
#  (e) errors: run.device = 'cuda' on a rank without a GPU, and two ranks on one GPU
#      without run.gpu_share, each stop every rank with the reason; a host read of device
#      memory (planted) stops the run naming it; a model larger than the device's memory
#      exits 2 with the numbers and the deck keys.
# Every run has the emulation's device-memory guard on (emu/emu.cpp, EMU_DEVICE_GUARD):
# op memory is cudaMalloc memory the host cannot touch outside copies, kernels and
# library calls, so a host dereference anywhere in these runs fails them.
# The GPU machine runs the same comparisons on the real device (tools/gpu/window.sh).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
emu_trainer_setup
C=(model.vocab_size=256 model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2
  model.d_ff=128 model.seq_len=32 train.micro_batch=2 train.global_batch=4 run.log_every=1
  run.eval_every=0 optim.warmup_steps=4 optim.lr=3e-3 "data.train=$SCRATCH/data/train_*.bin"
  "data.valid=$SCRATCH/data/valid_*.bin" run.eval_steps=2 checkpoint.every_steps=0
  checkpoint.resume=none train.xent_chunk_tokens=24)
# run NAME DEVICE NP ARGS...: a run into $SCRATCH/NAME (exit code in $SCRATCH/NAME.rc)
run() {
  local name=$1 dev=$2 np=$3 bin="$TESSERA"; shift 3
  [ "$dev" = cuda ] && bin="$EMU"
  timeout 600 "$MPIRUN" -np "$np" "$bin" /dev/null "${C[@]}" run.device="$dev" \
    run.gpu_share=.true. run.out_dir="$SCRATCH/$name" "$@" >"$SCRATCH/$name.out" 2>&1
  echo $? >"$SCRATCH/$name.rc"
}
agree() { agree_runs "$SCRATCH/$1" "$SCRATCH/$2" "$3" 2; }
rc_is() { [ "$(cat "$SCRATCH/$1.rc")" = "$2" ] || { tail -5 "$SCRATCH/$1.out"; return 1; }; }

# ---- (a) llama in fp32, bf16, fp16 ----
tol_of() { [ "$1" = fp32 ] && echo 2e-6 || echo 2e-4; }
for prec in fp32 bf16 fp16; do
  tol=$(tol_of $prec)
  # fp16 asks for our kernels (TSR_CUDA_ATTENTION=mma), bf16 takes the default (cuDNN's)
  ak=
  [ $prec = fp16 ] && ak=mma
  # fp32's device run, 4 steps, is also (d)'s straight run
  n=3
  [ $prec = fp32 ] && n=4
  run "cpu_$prec" cpu 1 run.max_steps=$n train.precision=$prec
  TSR_CUDA_ATTENTION=$ak run "gpu_$prec" cuda 1 run.max_steps=$n train.precision=$prec
  check "(a) $prec: the device run finishes (exit $(cat "$SCRATCH/gpu_$prec.rc"))" rc_is "gpu_$prec" 0
  check "(a) $prec: device and CPU agree to $tol" agree "gpu_$prec" "cpu_$prec" $tol
  check "(a) $prec: device memory after step 1 within 5% of tessera plan's GPU figure" \
    "$PYTHON_REF" -c 'import re, sys
m = re.search(r"in use ([0-9.]+) MB, .*planned on a GPU \((\w+) storage\): ([0-9.]+) MB",
              open(sys.argv[1]).read())
print("    measured %s MB, planned %s MB (%s)" % (m.group(1), m.group(3), m.group(2)))
sys.exit(0 if m.group(2) == sys.argv[2] and abs(float(m.group(3)) / float(m.group(1)) - 1) <= 0.05 else 1)' \
    "$SCRATCH/gpu_$prec.out" $prec
done
act_mb() { sed -n 's/^model: .* activations \([0-9.]*\) MB for .*/\1/p' "$SCRATCH/$1.out"; }
# (the fp32 row statistics of the norms, attention and the loss stay: 0.503x measured)
check "(a) bf16 activations on the device: about half of fp32's ($(act_mb gpu_bf16) vs $(act_mb gpu_fp32) MB)" \
  "$PYTHON_REF" -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if 0.49 <= a / b <= 0.52 else 1)' \
  "$(act_mb gpu_bf16)" "$(act_mb gpu_fp32)"
check "(a) fp32 attention runs the fp32 kernel" grep -q "^attention: fp32 kernel \[fp32" \
  "$SCRATCH/gpu_fp32.out"
check "(a) bf16 attention by default runs cuDNN's (the emulation's stand-in)" \
  grep -q "^attention: cuDNN fused flash attention on q, k, v in place (emulated cuDNN.*\[bf16 B 2 T 32 H 4 KV 2 hd 16\]" \
  "$SCRATCH/gpu_bf16.out"
check "(a) ... and reserves its workspace" grep -q "^cuda: cuDNN attention workspace" \
  "$SCRATCH/gpu_bf16.out"
check "(a) fp16 attention at head_dim 16, TSR_CUDA_ATTENTION=mma: the fp32-arithmetic kernel on 16-bit storage" \
  grep -q "^attention: fp32-arithmetic kernel on the 16-bit storage .*\[fp16 B 2 T 32 H 4 KV 2 hd 16\]" \
  "$SCRATCH/gpu_fp16.out"
check "(a) ... and no cuDNN workspace" sh -c "! grep -q '^cuda: cuDNN attention workspace' '$SCRATCH/gpu_fp16.out'"
# head_dim 32 (2 heads, 1 KV head): attention on the tensor cores (mma.sync), and on the
# emulation's stand-in for cuDNN's graphs (emu/sdpa_fake.c)
for prec in bf16 fp16; do
  run "cpu_hd32_$prec" cpu 1 run.max_steps=3 train.precision=$prec model.n_head=2 model.n_kv_head=1
  for k in mma cudnn; do
    TSR_CUDA_ATTENTION=$k run "hd32_${k}_$prec" cuda 1 run.max_steps=3 train.precision=$prec \
      model.n_head=2 model.n_kv_head=1
    case $k in
      mma) what="tensor cores, mma.sync kernels ($prec products; fp32 softmax and sums) [$prec" ;;
      cudnn) what="cuDNN fused flash attention on q, k, v in place (emulated cuDNN" ;;
    esac
    check "(a) $prec, head_dim 32, TSR_CUDA_ATTENTION=$k: the log names the path" \
      grep -qF "attention: $what" "$SCRATCH/hd32_${k}_$prec.out"
    check "(a) ... device and CPU agree to 2e-4" agree "hd32_${k}_$prec" "cpu_hd32_$prec" 2e-4
  done
done
check "(a) cuDNN's backward is the deterministic one (train.deterministic's default)" \
  grep -q "^attention: cuDNN .*deterministic backward" "$SCRATCH/hd32_cudnn_bf16.out"
TSR_CUDA_ATTENTION=flash run bad_attention_kernel cuda 1 run.max_steps=1
check "(a) TSR_CUDA_ATTENTION=flash is refused, naming the choices (exit $(cat "$SCRATCH/bad_attention_kernel.rc"))" \
  grep -q "TSR_CUDA_ATTENTION='flash': expected 'cudnn' or 'mma' (the default here: 'cudnn')" \
  "$SCRATCH/bad_attention_kernel.out"
TSR_CUDA_ATTENTION=wmma run wmma_removed cuda 1 run.max_steps=1
check "(a) TSR_CUDA_ATTENTION=wmma is refused: the kernels were removed, the choices named" \
  grep -q "TSR_CUDA_ATTENTION='wmma': the WMMA attention kernels were removed .*expected 'cudnn' or 'mma' (the default here: 'cudnn')" \
  "$SCRATCH/wmma_removed.out"
check "(a) ... with the exit status of an unknown value ($(cat "$SCRATCH/wmma_removed.rc"))" \
  sh -c "[ \"\$(cat '$SCRATCH/wmma_removed.rc')\" = \"\$(cat '$SCRATCH/bad_attention_kernel.rc')\" ] &&
    [ \"\$(cat '$SCRATCH/wmma_removed.rc')\" != 0 ]"
# a shape cuDNN declines (head_dim 4), asked for by default: our kernel instead, saying why
run cudnn_declines cuda 1 run.max_steps=1 train.precision=bf16 model.n_head=16 model.n_kv_head=8
check "(a) bf16, head_dim 4, cuDNN by default: our kernel, saying why not cuDNN" \
  grep -q "^attention: fp32-arithmetic kernel .*; not cuDNN: emulated cuDNN cannot run it: hidden_dim" \
  "$SCRATCH/cudnn_declines.out"
check "(a) ... and the run finishes" rc_is cudnn_declines 0
check "(a) the device is named in the log" grep -q "device: cuda, rank 0 on GPU 0 (CPU emulation" \
  "$SCRATCH/gpu_fp32.out"
check "(a) fp16 on the device logs its loss scale" grep -q "| scale 65536 |" "$SCRATCH/gpu_fp16.out"
check "(a) checkpoint.async = 'auto' on a GPU: background writes, saying why" grep -q \
  "checkpoint.async = 'auto': background writes, the training runs on the GPUs" "$SCRATCH/gpu_fp32.out"

# ---- (b) gpt2, full recompute, evaluation ----
G=(model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true. train.recompute=full
  run.max_steps=2 run.eval_every=2 train.xent_chunk_tokens=0)
for prec in fp32 bf16 fp16; do
  tol=$(tol_of $prec)
  run "cpu_gpt2_$prec" cpu 1 "${G[@]}" train.precision=$prec
  run "gpu_gpt2_$prec" cuda 1 "${G[@]}" train.precision=$prec
  check "(b) gpt2 in $prec on the device finishes" rc_is "gpu_gpt2_$prec" 0
  check "(b) ... device and CPU agree to $tol, validation included" \
    agree "gpu_gpt2_$prec" "cpu_gpt2_$prec" $tol
done

# ---- (c) two ranks on one GPU: dp (ZeRO-3), tp (sequence parallel), pp (1F1B) ----
for L in "dp parallel.zero_stage=3" "tp parallel.tp=2 parallel.sequence_parallel=.true." \
  "pp parallel.pp=2 parallel.schedule=1f1b"; do
  set -- $L
  name=$1
  shift
  run "cpu_$name" cpu 2 run.max_steps=2 "$@"
  run "gpu_$name" cuda 2 run.max_steps=2 "$@"
  check "(c) $name on 2 ranks sharing the GPU finishes" rc_is "gpu_$name" 0
  check "(c) $name: device and CPU agree" agree "gpu_$name" "cpu_$name" 2e-6
  check "(c) $name: its group goes through MPI on pinned host copies" \
    grep -q "^comm: .*${name}[a-z_]* mpi-staged.*MPI is not CUDA-aware" "$SCRATCH/gpu_$name.out"
  if [ "$name" = pp ]; then # pipeline stages talk by send/recv: staged MPI, not NCCL
    EMU_DEVICES=2 run nccl_pp cuda 2 run.max_steps=2 run.gpu_share=.false. "$@"
    check "(c') pp with a GPU per rank: send/recv through staged MPI" \
      grep -q "^comm: pp mpi-staged" "$SCRATCH/nccl_pp.out"
    check "(c') pp with a GPU per rank: device and CPU agree" agree nccl_pp cpu_pp 2e-6
    continue
  fi
  check "(c) $name: the log says NCCL cannot serve ranks sharing a GPU" \
    grep -q "share a GPU (run.gpu_share), which NCCL cannot do" "$SCRATCH/gpu_$name.out"
  # (c') the same layout with a GPU per rank: through NCCL
  rm -f "$SCRATCH/trace"
  EMU_DEVICES=2 EMU_NCCL_TRACE="$SCRATCH/trace" run "nccl_$name" cuda 2 run.max_steps=2 \
    run.gpu_share=.false. "$@"
  check "(c') $name with a GPU per rank finishes" rc_is "nccl_$name" 0
  check "(c') $name: the log puts its group on NCCL" grep -q "^comm: .*$name.* nccl" \
    "$SCRATCH/nccl_$name.out"
  check "(c') $name: NCCL carried collectives on both ranks" \
    awk '$6 + $8 + $10 + $12 + $14 > 0 { n++ } END { exit n < 2 }' "$SCRATCH/trace"
  check "(c') $name through NCCL: device and CPU agree" agree "nccl_$name" "cpu_$name" 2e-6
done
# context parallelism on 2 ranks sharing the GPU: the ring (the block ops, copy_2d, the
# K|V blocks and fp32 dK|dV sums passed with send/recv) and the all-to-alls (send/recv
# pairs on a device), each against the CPU's cp 2
for way in p2p a2a; do
  run "cpu_cp_$way" cpu 2 run.max_steps=2 parallel.cp=2 parallel.cp_comm=$way
  run "gpu_cp_$way" cuda 2 run.max_steps=2 parallel.cp=2 parallel.cp_comm=$way
  check "(c) cp 2 ($way) on 2 ranks sharing the GPU finishes" rc_is "gpu_cp_$way" 0
  check "(c) cp 2 ($way): device and CPU agree" agree "gpu_cp_$way" "cpu_cp_$way" 2e-6
  check "(c) cp 2 ($way): the cp group goes through MPI on pinned host copies" \
    grep -q "^comm: .*cp mpi-staged" "$SCRATCH/gpu_cp_$way.out"
done
run direct_dp cuda 2 run.max_steps=2 parallel.zero_stage=3 parallel.mpi_gpu=direct
check "(c) dp with mpi_gpu = 'direct' on an MPI that is not CUDA-aware: exit 2 (bad input)" \
  rc_is direct_dp 2
check "(c) ... naming the group and the way out" grep -q "parallel.mpi_gpu = 'direct' hands group \
'dp_shard' device memory through MPI, and this MPI is not CUDA-aware.*'staged' or 'auto'" \
  "$SCRATCH/direct_dp.out"
H=(run.max_steps=2 parallel.tp=2 parallel.ranks_per_node=2 parallel.zero_stage=1
  train.global_batch=4)
run cpu_hybrid cpu 4 "${H[@]}"
EMU_DEVICES=4 run nccl_hybrid cuda 4 "${H[@]}" run.gpu_share=.false.
check "(c') tp 2 x dp 2 over two nodes finishes" rc_is nccl_hybrid 0
check "(c') ... tp on NCCL, dp across the nodes on staged MPI (the default inter_node)" \
  grep -q "^comm: tp nccl, dp_shard mpi-staged (across nodes)" "$SCRATCH/nccl_hybrid.out"
check "(c') ... and agrees with the CPU" agree nccl_hybrid cpu_hybrid 2e-6
EMU_DEVICES=4 run nccl_hybrid_n cuda 4 "${H[@]}" run.gpu_share=.false. parallel.inter_node=nccl
check "(c') ... with inter_node = 'nccl': dp across the nodes on NCCL too" \
  grep -q "^comm: tp nccl, dp_shard nccl (across nodes)" "$SCRATCH/nccl_hybrid_n.out"
check "(c') ... and agrees with the CPU" agree nccl_hybrid_n cpu_hybrid 2e-6

# ---- (d) restart on the device, and its checkpoint on the CPU ----
# the straight run: (a)'s gpu_fp32, 4 steps of the same deck (fp32 is the default)
run half cuda 1 run.max_steps=2 checkpoint.every_steps=2 run.out_dir="$SCRATCH/rs"
mkdir -p "$SCRATCH/oncpu" && cp -r "$SCRATCH/rs/ckpt" "$SCRATCH/oncpu/"
run rest cuda 1 run.max_steps=4 checkpoint.resume=auto run.out_dir="$SCRATCH/rs"
check "(d) the resumed device run finishes" rc_is rest 0
check "(d) resumed at step 2" grep -q "resumed from .* at step 2" "$SCRATCH/rest.out"
check "(d) 2 + 2 steps on the device equal 4 straight, bitwise" \
  "$PYTHON_REF" - "$SCRATCH/gpu_fp32/metrics.jsonl" "$SCRATCH/rs/metrics.jsonl" <<'PY'
import json, sys
a, b = ({d["step"]: (d["loss"], d["grad_norm"]) for d in map(json.loads, open(p)) if "loss" in d}
        for p in sys.argv[1:3])
assert sorted(a) == [1, 2, 3, 4] and sorted(b) == [1, 2, 3, 4], (a, b)
assert all(a[s] == b[s] for s in a), (a, b)
print("    steps 1-4:", [a[s][0] for s in sorted(a)])
PY
run oncpu cpu 1 run.max_steps=3 checkpoint.resume=auto
check "(d) the device's step-2 checkpoint resumes on the CPU" grep -q "resumed from .* at step 2" \
  "$SCRATCH/oncpu.out"
check "(d) ... and its step 3 is the device's step 3 (to 2e-6)" "$PYTHON_REF" - \
  "$SCRATCH/gpu_fp32/metrics.jsonl" "$SCRATCH/oncpu/metrics.jsonl" <<'PY'
import json, sys
a, b = ({d["step"]: d["loss"] for d in map(json.loads, open(p)) if "loss" in d} for p in sys.argv[1:3])
print(f"    step 3: device {a[3]!r}, CPU from the device's checkpoint {b[3]!r}")
sys.exit(0 if abs(a[3] - b[3]) <= 2e-6 * a[3] else 1)
PY

# ---- (f) document masking ----
"$top_srcdir/tools/tsr-prepare" --out "$SCRATCH/lines" --tokenizer bytes --split-by lines \
  /usr/share/games/fortunes/computers >/dev/null
D=(data.document_mask=.true. "data.train=$SCRATCH/lines/train_*.bin" model.seq_len=64
  "data.valid=$SCRATCH/lines/valid_*.bin" run.max_steps=3 run.eval_every=3)
for L in "llama_fp32 train.precision=fp32 model.n_head=2 model.n_kv_head=1" \
  "llama_bf16 train.precision=bf16 model.n_head=2 model.n_kv_head=1" \
  "gpt2_fp32 train.precision=fp32 model.arch=gpt2 model.n_kv_head=4"; do
  set -- $L
  name=$1
  shift
  tol=$(tol_of "${name#*_}")
  run "cpu_docs_$name" cpu 1 "${D[@]}" "$@"
  run "gpu_docs_$name" cuda 1 "${D[@]}" "$@"
  check "(f) document masking, $name, on the device finishes" rc_is "gpu_docs_$name" 0
  check "(f) ... device and CPU agree to $tol, validation included" \
    agree "gpu_docs_$name" "cpu_docs_$name" $tol
done
check "(f) bf16 masked attention: cuDNN's by default, so the log says our kernels run it" \
  grep -q "^attention: tensor cores, mma.sync kernels (bf16 .*; not cuDNN: document masking.*document-masked\]" \
  "$SCRATCH/gpu_docs_llama_bf16.out"
run cpu_docs_pp cpu 2 "${D[@]}" parallel.pp=2
run gpu_docs_pp cuda 2 "${D[@]}" parallel.pp=2
check "(f) document masking, pp 2 sharing the GPU, finishes" rc_is gpu_docs_pp 0
check "(f) ... device and CPU agree" agree gpu_docs_pp cpu_docs_pp 2e-6

# ---- (e) errors ----
# device memory is the host's to reach through copies only: a planted host read of op
# memory (TSR_FAULT host_read_step) stops the run where it happens, naming the reader
TSR_FAULT=host_read_step=1 run host_read cuda 1 run.max_steps=2
check "(e) a host read of device memory fails the run" test "$(cat "$SCRATCH/host_read.rc")" -ne 0
check "(e) ... the emulation names it and the host function that read" grep -q \
  "emu: host code touched device memory at .* of a cudaMalloc allocation" "$SCRATCH/host_read.out"
check "(e) ... in train_step's caller" grep -q "(tsr_train+" "$SCRATCH/host_read.out"
check "(e) ... and the same run without the planted read passes the guard" rc_is gpu_fp32 0
# a run larger than the device: exit 2 with the bytes asked and free and the deck keys
# (34 MB: the backend's 32 MiB cuBLASLt workspace fits, the model's 2.5 MB do not)
EMU_DEVICE_MEM=34000000 run too_big cuda 1 run.max_steps=1
check "(e) a model larger than the device's memory: exit 2 (bad input)" rc_is too_big 2
check "(e) ... naming the bytes asked, the bytes free and the deck keys that shrink it" grep -q \
  "out of device memory on GPU 0: an op buffer asks for [0-9]* bytes .*, [0-9]* bytes .* are free of .*Shrink it with train.micro_batch .*train.recompute.*parallel.zero_stage" \
  "$SCRATCH/too_big.out"
EMU_DEVICES=0 run nogpu cuda 2 run.max_steps=1
check "(e) run.device = 'cuda' without a GPU: exit 1" rc_is nogpu 1
check "(e) ... saying so" grep -q "no usable CUDA device" "$SCRATCH/nogpu.out"
timeout 300 "$MPIRUN" -np 2 "$EMU" /dev/null "${C[@]}" run.device=cuda run.max_steps=1 \
  run.out_dir="$SCRATCH/clash" >"$SCRATCH/clash.out" 2>&1
check "(e) two ranks on one GPU without run.gpu_share: exit 2 (bad input)" test $? -eq 2
check "(e) ... naming the sharing" grep -q "shares GPU 0" "$SCRATCH/clash.out"
finish
