#!/usr/bin/env bash
# act_offload_emu.sh — the activation offload (train.activation_offload) on the CUDA backend
# without a GPU (emu/emu-tessera.sh: the CUDA kernels on the CPU emulation, whose streams
# run in order): every layer's stored activations and input go to page-locked host memory
# after its forward, on the copy stream, and come back ahead of its backward into a window
# of 2 layer blocks on the device.  Against the same run without it, every step's loss and
# gradient norm and the final checkpoint's model and optimizer datasets are bitwise equal:
# bf16 and fp32 on one rank, recompute selective and full, and on 2 ranks sharing the
# emulated GPU dp 2 at ZeRO-1 and ZeRO-3, tp 2, pp 2 (1F1B, 2 micro-batches in flight;
# interleaved, 2 chunks a stage) and cp 2; an fp16 run whose loss scale overflows on some
# steps skips the same ones.  Memory: the activations the device keeps for the backward
# are the window's 2 blocks and each slot's chunk output, which the test computes from the
# shapes, and the device memory in use at step 1 drops by exactly what the run says left
# it; the host holds slots x layers blocks.
# The zero-bubble schedules ZB-H1 and ZB-V (pp 2, their W pass bringing each layer's block
# back a second time) are bitwise too; on the CPU the key is accepted with one log line.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
emu_trainer_setup
# small shapes (the emulation runs every GPU thread as a CPU fiber), 4 layers: twice the
# window
C=(model.vocab_size=256 model.n_layer=4 model.d_model=32 model.n_head=2 model.n_kv_head=1
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.log_every=1
  run.eval_every=0 optim.warmup_steps=4 optim.lr=3e-3 "data.train=$SCRATCH/data/train_*.bin"
  run.max_steps=2 checkpoint.every_steps=0 checkpoint.resume=none train.xent_chunk_tokens=8
  train.precision=bf16)
A=train.activation_offload=.true.
run() { emu_run "$@"; } # run NAME DEVICE NP ARGS... (tests/lib.sh)
pair() { # pair DESCRIPTION NAME NP ARGS...: without and with the offload, compared bitwise
  local what=$1 name=$2 np=$3
  shift 3
  run "$name" cuda "$np" "$@"
  local r1=$?
  run "${name}_act" cuda "$np" "$@" $A
  local r2=$?
  check "$what: both run" test $r1 -eq 0 -a $r2 -eq 0
  [ $r1 -eq 0 ] || tail -5 "$SCRATCH/$name.out"
  [ $r2 -eq 0 ] || tail -5 "$SCRATCH/${name}_act.out"
  same_metrics "$name" "${name}_act"
  check "$what: losses and gradient norms bitwise equal with the activations offloaded" \
    test $? -eq 0
  check "$what: the final checkpoints' weights and optimizer state are bitwise equal" \
    same_ckpt "$name" "${name}_act"
}
pair "bf16, one rank" b 1
check "the run says the activations are offloaded" grep -q \
  "^offload: every layer's stored activations go to page-locked host memory" "$SCRATCH/b_act.out"
pair "fp32, one rank" f 1 train.precision=fp32
pair "bf16, recompute selective" s 1 train.recompute=selective
pair "bf16, recompute full" u 1 train.recompute=full
pair "bf16, dp 2 ZeRO-1" z1 2 parallel.zero_stage=1
pair "bf16, dp 2 ZeRO-3" z3 2 parallel.zero_stage=3
pair "bf16, tp 2" t2 2 parallel.tp=2
pair "bf16, pp 2 1F1B, 4 micro-batches" p2 2 parallel.pp=2 parallel.schedule=1f1b \
  train.global_batch=4
pair "fp32, pp 2 1F1B, recompute selective" p2s 2 parallel.pp=2 parallel.schedule=1f1b \
  train.global_batch=4 train.precision=fp32 train.recompute=selective
pair "bf16, pp 2 interleaved, 2 chunks of 1 layer a stage" pi 2 parallel.pp=2 \
  parallel.virtual_stages=2 parallel.schedule=interleaved train.global_batch=4
pair "bf16, cp 2" c2 2 parallel.cp=2
# fp16: a loss scale of 2^20 overflows some of the 4 steps, which are skipped and halve it
pair "fp16, loss scale overflowing" h 1 train.precision=fp16 train.loss_scale=1048576 \
  run.max_steps=4
s1=$(skips h) s2=$(skips h_act)
check "  ... both skip the same $s1 step(s) of 4 (at least one, not all)" \
  test "$s1" = "$s2" -a "$s1" -ge 1 -a "$s1" -lt 4

# Memory.  The stored activations the device keeps (the run's line) against the shapes:
# per layer (recompute none) norm1, norm2, qkv, attention out, h, fc, act in the storage
# type, lse and 4 norm statistics in fp32, and its input; each buffer of a block at a
# multiple of 256 bytes.  Without the offload every slot keeps L layer sets and L + 1 rows
# of the residual stream; with it the device keeps 2 blocks and each slot's output, the host
# slots x L blocks.  The memory in use at step 1 drops by exactly the difference.
stored() { sed -n 's/^activations stored for the backward (rank 0): \([0-9]*\) bytes on the device.*/\1/p' "$SCRATCH/$1.out" | head -1; }
host() { sed -n 's/^activations stored .* \([0-9]*\) bytes in page-locked host memory.*/\1/p' "$SCRATCH/$1.out" | head -1; }
inuse() { sed -n 's/^memory at step 1, most on any rank: in use \([0-9.]*\) MB.*/\1/p' "$SCRATCH/$1.out" | head -1; }
memcheck() { # memcheck NAME ESZ RECOMPUTE SLOTS LAYERS [-] [zb]: the numbers of NAME and
  # NAME_act (-: not the memory in use, which is the fullest rank's, where rank 0's line is
  # stage 0's; zb: a split backward, each layer also keeping B's stash for W, in its block)
  local name=$1
  local d0 d1 h1 u0 u1
  d0=$(stored "$name") d1=$(stored "${name}_act") h1=$(host "${name}_act")
  u0=$(inuse "$name") u1=$(inuse "${name}_act")
  echo "    $name: stored on the device ${d0:-?} bytes without, ${d1:-?} with the offload" \
    "(host ${h1:-?}); in use at step 1 ${u0:-?} MB without, ${u1:-?} MB with"
  [ "${6:-}" = - ] && u0=0 u1=0
  "$PYTHON_REF" - "$2" "$3" "$4" "$5" "${d0:-x}" "${d1:-x}" "${h1:-x}" "${u0:-x}" "${u1:-x}" \
    "${7:-}" <<'PY'
import sys
esz, rec, slots, L = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
d0, d1, h1 = (int(a) for a in sys.argv[5:8])
u0, u1 = (float(a) for a in sys.argv[8:10])
zb = sys.argv[10] == "zb"
N, C, H, KV, hd, F = 16, 32, 2, 1, 16, 64  # the test's shapes, micro-batch 1, llama
qkv, fc = N * (H + 2 * KV) * hd, N * 2 * F
dt = [N * C, N * C, qkv, N * H * hd, N * C, fc, N * F]     # norm1 norm2 qkv atty h fc act
f32 = [H * N, N, N, N, N]                                   # lse, two norms' mean and rstd
if rec == "none":
    keep_dt, keep_f = dt, f32
elif rec == "selective":
    keep_dt, keep_f = dt[2:6], f32
else:
    keep_dt, keep_f = [], []
row = N * C * esz
# B's stash for W: d_down, d_o [N, C], d_fc, d_qkv in the storage type, norm w and b [2C] fp32
stash_dt, stash_f = ([N * C, N * C, fc, qkv], [2 * C, 2 * C]) if zb else ([], [])
keep_dt, keep_f = keep_dt + stash_dt, keep_f + stash_f
layer = sum(n * esz for n in keep_dt) + sum(n * 4 for n in keep_f)
pad = lambda b: (b + 255) // 256 * 256
block = sum(pad(n * esz) for n in keep_dt) + sum(pad(n * 4) for n in keep_f) + pad(row)
want0 = slots * (L * layer + (L + 1) * row)
want1 = 2 * block + slots * row
print(f"    formula: {want0} bytes without ({slots} slot(s) x ({L} layers x {layer} + {L + 1} rows"
      f" x {row})), {want1} with (2 blocks x {block} + {slots} x {row}), host {slots * L * block};"
      f" the device saves {d0 - d1} bytes, in use dropped {(u0 - u1) * 1e6:.0f}")
ok = d0 == want0 and d1 == want1 and h1 == slots * L * block
ok = ok and d1 <= 2 * (layer + row) + 2 * 256 * (len(keep_dt) + len(keep_f) + 1) + slots * row
ok = ok and (u0 == u1 == 0 or abs((u0 - u1) * 1e6 - (d0 - d1)) <= 1000.0)  # 0.001 MB
sys.exit(0 if ok else 1)
PY
}
memcheck b 2 none 1 4
check "bf16: the device keeps 2 layer blocks and the slot's output, the host 4 blocks; in use drops by the rest" \
  test $? -eq 0
# the planner's host column against the page-locked blocks (the memory line after step 1)
for n in b_act p2_act; do
  line=$(grep -o "page-locked host memory of the activation offload: [0-9.]* MB, planned [0-9.]* MB" \
    "$SCRATCH/$n.out" | head -1)
  echo "    $n: ${line:-no host figure}"
  check "$n: the planner's host column is the blocks allocated" \
    "$PYTHON_REF" -c "import sys; h, p = [float(w) for w in sys.argv[1].split() if w[0].isdigit()]; sys.exit(0 if h > 0 and h == p else 1)" "${line:-x}"
done
memcheck u 2 full 1 4
check "recompute full: only the layers' inputs are stored, 2 of them on the device" test $? -eq 0
memcheck f 4 none 1 4
check "fp32: the same in 4-byte storage" test $? -eq 0
memcheck p2 2 none 2 2 -
check "pp 2 1F1B, stage 0 (2 micro-batches in flight, 2 layers): 2 blocks and 2 slots' outputs" \
  test $? -eq 0

# the zero-bubble schedules split the backward in two passes: the W pass brings every
# layer's block back a second time
pair "bf16, pp 2 ZB-H1, 4 micro-batches" zh 2 parallel.pp=2 parallel.schedule=zb_h1 \
  train.global_batch=4
pair "bf16, pp 2 ZB-V (2 chunks a stage), 4 micro-batches" zv 2 parallel.pp=2 \
  parallel.virtual_stages=2 parallel.schedule=zb_v train.global_batch=4
memcheck zh 2 none 2 2 - zb
check "pp 2 ZB-H1, stage 0: B's stash for W travels in the layers' blocks too (2 blocks and 2 slots' outputs on the device)" \
  test $? -eq 0
# the CPU has nothing to move
run cpu cpu 1 $A run.max_steps=1
check "on the CPU the key is accepted, saying there is nothing to move" grep -q \
  "^offload: this run is on the CPU.*train.activation_offload = .true. has nothing to move" \
  "$SCRATCH/cpu.out"
finish
