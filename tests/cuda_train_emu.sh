#!/usr/bin/env bash
# cuda_train_emu.sh — the trainer on its CUDA backend (run.device = 'cuda', cuda/ops_dev.c)
# without a GPU: tests/cuda/emu-tessera.sh links tessera with the CUDA kernels run on the
# CPU emulation (tests/cuda/emu/), so every op, copy, fill, scratch use and device-scalar
# fetch of the device path runs, against the CPU backend from the same seed:
#  (a) llama fp32, bf16 and fp16 (loss scaling): the loss and gradient norm of every step
#      agree with run.device = 'cpu' (losses: fp32 to 2e-6 relative, measured 2e-9; bf16
#      and fp16 with fp32 GEMMs (train.gpu_gemm = 'exact') to 1e-4, measured 2e-7 and 2e-6:
#      a different summation order flips some roundings to 16 bits; gradient norms to 10x
#      that); bf16 and fp16 with tensor-core GEMMs (the default, 'fast': bf16 copies the
#      GEMM inputs into the staging of cuda/ops_dev.c for bf16 GEMMs, and the log's count
#      says every product ran so; fp16 has the emulated cuBLASLt round them) to 1e-2.
#      bf16 'fast' differs from 'exact' (activation gradients are fp32 values, rounded on
#      the way into the backward GEMMs); fp16 'fast' equals 'exact' bitwise (fp16 stores
#      activation gradients in fp16 too, so every GEMM input already is an fp16 value: the
#      tensor cores lose nothing); at head_dim 32 the attention runs on the tensor cores,
#      with the WMMA and the mma.sync kernels (TSR_CUDA_ATTENTION), each to 1e-2, and an
#      unknown TSR_CUDA_ATTENTION is refused;
#  (b) gpt2 (LayerNorm, GELU, biases, learned positions, tied embeddings), full recompute,
#      with a validation pass: training and validation losses agree; in bf16 with staged
#      GEMMs too (biases in the epilogue, their gradients summed from the fp32 dy), to
#      1e-3 (measured 1e-5 on losses, 1.1e-4 on gradient norms; dropping the bias
#      gradients of the staged path is 42% off on the gradient norm);
#  (c) 2 ranks sharing the one emulated GPU (run.gpu_share): dp 2 at ZeRO-3, tp 2 with
#      sequence parallelism, pp 2 on 1F1B give the CPU's losses (NCCL cannot put two ranks
#      on one GPU, and the log says so; Debian's Open MPI is not CUDA-aware, so the groups
#      go through MPI on pinned host copies, cuda/comm_stage.c, and pp's send/recv too;
#      &parallel mpi_gpu = 'direct' hands MPI the device memory itself, same losses);
#  (c') a GPU per rank (EMU_DEVICES): dp 2 at ZeRO-3 and tp 2 with sequence parallelism
#      through NCCL (cuda/comm_nccl.c, emulated), pp 2 through staged MPI, and tp 2 x dp 2
#      on two "nodes" (tp on NCCL, dp across the nodes on staged MPI by default, on plain
#      MPI with mpi_gpu = 'direct', on NCCL with &parallel inter_node = 'nccl'), give the
#      CPU's losses; the emulated NCCL's trace shows it carried the traffic;
#  (d) restart on the device: 2 steps + resume to 4 equals 4 straight steps bitwise, and
#      the device's checkpoint resumes on the CPU;
#  (e) errors: run.device = 'cuda' on a rank without a GPU, and two ranks on one GPU
#      without run.gpu_share, each stop every rank with the reason.
# The GPU machine runs the same comparisons on the real device (tests/cuda/).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
EMU="$SCRATCH/tessera-emu"
emu_link tessera "$EMU"
bytes_corpus computers
export TSR_GEMM_PROBE_N=64 # the MFU probe's GEMM is a plain loop here
C=(model.vocab_size=256 model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2
  model.d_ff=128 model.seq_len=32 train.micro_batch=2 train.global_batch=4 run.log_every=1
  run.eval_every=0 optim.warmup_steps=4 optim.lr=3e-3 "data.train=$SCRATCH/data/train_*.bin"
  "data.valid=$SCRATCH/data/valid_*.bin" run.eval_steps=2 checkpoint.every_steps=0
  checkpoint.resume=none)
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
for prec in fp32 bf16 fp16; do
  tol=2e-6
  [ $prec != fp32 ] && tol=1e-4
  run "cpu_$prec" cpu 1 run.max_steps=3 train.precision=$prec
  run "gpu_$prec" cuda 1 run.max_steps=3 train.precision=$prec train.gpu_gemm=exact
  check "(a) $prec: the device run finishes (exit $(cat "$SCRATCH/gpu_$prec.rc"))" rc_is "gpu_$prec" 0
  check "(a) $prec: device and CPU agree to $tol" agree "gpu_$prec" "cpu_$prec" $tol
  [ $prec = fp32 ] && continue
  run "fast_$prec" cuda 1 run.max_steps=3 train.precision=$prec
  check "(a) $prec, tensor-core GEMMs: finishes, saying so" grep -q "^gemm: $prec inputs on tensor cores" \
    "$SCRATCH/fast_$prec.out"
  check "(a) $prec, tensor-core GEMMs: device and CPU agree to 1e-2" agree "fast_$prec" "cpu_$prec" 1e-2
  if [ $prec = bf16 ]; then
    check "(a) bf16, tensor-core GEMMs: every product ran on bf16 copies in the staging" \
      grep -Eq "^gemm: ([0-9]+) of \1 products ran on bf16 copies of their inputs$" \
      "$SCRATCH/fast_bf16.out"
  fi
  want=differ
  [ $prec = fp16 ] && want=equal
  check "(a) $prec, tensor-core GEMMs: losses and norms $want those of fp32 GEMMs" \
    "$PYTHON_REF" -c 'import json, sys
m = [[(d["loss"], d["grad_norm"]) for d in map(json.loads, open(p)) if "loss" in d] for p in sys.argv[2:]]
print("    gradient norms, fast vs exact:", [(a[1], b[1]) for a, b in zip(*m)])
sys.exit(0 if len(m[0]) == 3 and (m[0] == m[1]) == (sys.argv[1] == "equal") else 1)' $want \
    "$SCRATCH/fast_$prec/metrics.jsonl" "$SCRATCH/gpu_$prec/metrics.jsonl"
done
# head_dim 32 (2 heads, 1 KV head): attention on the tensor cores, both kernel sets
run cpu_hd32 cpu 1 run.max_steps=3 train.precision=bf16 model.n_head=2 model.n_kv_head=1
for k in wmma mma; do
  TSR_CUDA_ATTENTION=$k run "fast_hd32_$k" cuda 1 run.max_steps=3 train.precision=bf16 \
    model.n_head=2 model.n_kv_head=1
  check "(a) bf16, head_dim 32: attention ran the $k tensor-core kernels" \
    grep -qi "^attention: tensor cores, $k" "$SCRATCH/fast_hd32_$k.out"
  check "(a) ... device and CPU agree to 1e-2" agree "fast_hd32_$k" cpu_hd32 1e-2
done
TSR_CUDA_ATTENTION=flash run bad_attention_kernel cuda 1 run.max_steps=1
check "(a) TSR_CUDA_ATTENTION=flash is refused, naming the choices" \
  grep -q "TSR_CUDA_ATTENTION='flash': expected 'wmma' (the default), 'mma' or 'cudnn'" \
  "$SCRATCH/bad_attention_kernel.out"
# cuDNN attention's path (cuda/ops_dev.c, cuda/sdpa_stage.c: staging, casts, lse, the
# gradients added back) with the emulation's stand-in for cuDNN's graphs
# (tests/cuda/emu/sdpa_fake.c): head_dim 16 and 32, grouped (4 heads over 2) and not.
# To 1e-3 (grad norms 1e-2): measured 5.9e-6 and 4.9e-5 (norms 4e-4, 1e-3), while K and V
# swapped in sdpa_stage.c's forward gave 4.0e-3 (9.8e-2) at head_dim 16, inside 1e-2.
TSR_CUDA_ATTENTION=cudnn run fast_cudnn cuda 1 run.max_steps=3 train.precision=bf16
check "(a) bf16, TSR_CUDA_ATTENTION=cudnn: attention ran the cuDNN path" \
  grep -q "^attention: cuDNN fused flash attention on bf16 copies of q, k, v (emulated cuDNN" \
  "$SCRATCH/fast_cudnn.out"
check "(a) ... device and CPU agree to 1e-3" agree fast_cudnn cpu_bf16 1e-3
TSR_CUDA_ATTENTION=cudnn run fast_hd32_cudnn cuda 1 run.max_steps=3 train.precision=bf16 \
  model.n_head=2 model.n_kv_head=1
check "(a) bf16, head_dim 32, cuDNN path: device and CPU agree to 1e-3" \
  agree fast_hd32_cudnn cpu_hd32 1e-3
# a shape cuDNN declines (head_dim 4): our kernels instead, saying why
TSR_CUDA_ATTENTION=cudnn run cudnn_declines cuda 1 run.max_steps=1 train.precision=bf16 \
  model.n_head=16 model.n_kv_head=8
check "(a) bf16, head_dim 4, TSR_CUDA_ATTENTION=cudnn: our fp32 kernel, saying why not cuDNN" \
  grep -q "^attention: fp32 kernel .*; not cuDNN: emulated cuDNN cannot run it: hidden_dim" \
  "$SCRATCH/cudnn_declines.out"
check "(a) ... and the run finishes" rc_is cudnn_declines 0
check "(a) the device is named in the log" grep -q "device: cuda, rank 0 on GPU 0 (CPU emulation" \
  "$SCRATCH/gpu_fp32.out"
check "(a) fp16 on the device logs its loss scale" grep -q "| scale 65536 |" "$SCRATCH/gpu_fp16.out"

# ---- (b) gpt2, full recompute, evaluation ----
G=(model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true. train.recompute=full
  run.max_steps=2 run.eval_every=2)
run cpu_gpt2 cpu 1 "${G[@]}"
run gpu_gpt2 cuda 1 "${G[@]}"
check "(b) gpt2 on the device finishes" rc_is gpu_gpt2 0
check "(b) gpt2: device and CPU agree, validation included" agree gpu_gpt2 cpu_gpt2 2e-6
run cpu_gpt2_bf16 cpu 1 "${G[@]}" train.precision=bf16
run fast_gpt2_bf16 cuda 1 "${G[@]}" train.precision=bf16
check "(b) gpt2 in bf16, staged bf16 GEMMs: every product on bf16 copies" \
  grep -Eq "^gemm: ([0-9]+) of \1 products ran on bf16 copies of their inputs$" \
  "$SCRATCH/fast_gpt2_bf16.out"
check "(b) ... device and CPU agree to 1e-3, validation included" agree fast_gpt2_bf16 \
  cpu_gpt2_bf16 1e-3
no_staging() { local f; for f; do [ -s "$f" ] && ! grep -q "bf16 GEMM staging" "$f" || return 1; done; }
check "(a, b) 'exact', fp32 and fp16 runs reserve no bf16 staging" no_staging \
  "$SCRATCH"/gpu_{fp32,bf16,fp16}.out "$SCRATCH/fast_fp16.out" "$SCRATCH/gpu_gpt2.out"

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
run direct_dp cuda 2 run.max_steps=2 parallel.zero_stage=3 parallel.mpi_gpu=direct
check "(c) dp with mpi_gpu = 'direct': MPI gets the device memory itself" \
  grep -q "^comm: dp_shard mpi;" "$SCRATCH/direct_dp.out"
check "(c) ... and agrees with the CPU" agree direct_dp cpu_dp 2e-6
H=(run.max_steps=2 parallel.tp=2 parallel.ranks_per_node=2 parallel.zero_stage=1
  train.global_batch=4)
run cpu_hybrid cpu 4 "${H[@]}"
EMU_DEVICES=4 run nccl_hybrid cuda 4 "${H[@]}" run.gpu_share=.false.
check "(c') tp 2 x dp 2 over two nodes finishes" rc_is nccl_hybrid 0
check "(c') ... tp on NCCL, dp across the nodes on staged MPI (the default inter_node)" \
  grep -q "^comm: tp nccl, dp_shard mpi-staged (across nodes)" "$SCRATCH/nccl_hybrid.out"
check "(c') ... and agrees with the CPU" agree nccl_hybrid cpu_hybrid 2e-6
EMU_DEVICES=4 run nccl_hybrid_d cuda 4 "${H[@]}" run.gpu_share=.false. parallel.mpi_gpu=direct
check "(c') ... with mpi_gpu = 'direct': dp across the nodes on plain MPI" \
  grep -q "^comm: tp nccl, dp_shard mpi (across nodes)" "$SCRATCH/nccl_hybrid_d.out"
check "(c') ... and agrees with the CPU" agree nccl_hybrid_d cpu_hybrid 2e-6
EMU_DEVICES=4 run nccl_hybrid_n cuda 4 "${H[@]}" run.gpu_share=.false. parallel.inter_node=nccl
check "(c') ... with inter_node = 'nccl': dp across the nodes on NCCL too" \
  grep -q "^comm: tp nccl, dp_shard nccl (across nodes)" "$SCRATCH/nccl_hybrid_n.out"
check "(c') ... and agrees with the CPU" agree nccl_hybrid_n cpu_hybrid 2e-6

# ---- (d) restart on the device, and its checkpoint on the CPU ----
run straight cuda 1 run.max_steps=4
run half cuda 1 run.max_steps=2 checkpoint.every_steps=2 run.out_dir="$SCRATCH/rs"
mkdir -p "$SCRATCH/oncpu" && cp -r "$SCRATCH/rs/ckpt" "$SCRATCH/oncpu/"
run rest cuda 1 run.max_steps=4 checkpoint.resume=auto run.out_dir="$SCRATCH/rs"
check "(d) the resumed device run finishes" rc_is rest 0
check "(d) resumed at step 2" grep -q "resumed from .* at step 2" "$SCRATCH/rest.out"
check "(d) 2 + 2 steps on the device equal 4 straight, bitwise" \
  "$PYTHON_REF" - "$SCRATCH/straight/metrics.jsonl" "$SCRATCH/rs/metrics.jsonl" <<'PY'
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
  "$SCRATCH/straight/metrics.jsonl" "$SCRATCH/oncpu/metrics.jsonl" <<'PY'
import json, sys
a, b = ({d["step"]: d["loss"] for d in map(json.loads, open(p)) if "loss" in d} for p in sys.argv[1:3])
print(f"    step 3: device {a[3]!r}, CPU from the device's checkpoint {b[3]!r}")
sys.exit(0 if abs(a[3] - b[3]) <= 2e-6 * a[3] else 1)
PY

# ---- (e) errors ----
EMU_DEVICES=0 run nogpu cuda 2 run.max_steps=1
check "(e) run.device = 'cuda' without a GPU: exit 1" rc_is nogpu 1
check "(e) ... saying so" grep -q "no usable CUDA device" "$SCRATCH/nogpu.out"
timeout 300 "$MPIRUN" -np 2 "$EMU" /dev/null "${C[@]}" run.device=cuda run.max_steps=1 \
  run.out_dir="$SCRATCH/clash" >"$SCRATCH/clash.out" 2>&1
check "(e) two ranks on one GPU without run.gpu_share: exit 2 (bad input)" test $? -eq 2
check "(e) ... naming the sharing" grep -q "shares GPU 0" "$SCRATCH/clash.out"
finish
