#!/usr/bin/env bash
# offload_emu.sh — the optimizer offload (parallel.offload = 'optimizer') on the CUDA
# backend without a GPU (emu/emu-tessera.sh: the CUDA kernels on the CPU emulation): the
# shard's fp32 master weights and Adam moments live in page-locked host memory and the
# host's AdamW updates them.  Against the same run without offload, every step's loss and
# gradient norm and the final checkpoint's model and optimizer datasets are bitwise equal
# (the emulation runs the device's AdamW as compiled CPU code, the same arithmetic in the
# same order): bf16 and fp32 on one rank, and on 2 ranks sharing the emulated GPU dp 2 at
# ZeRO-1 and ZeRO-3, tp 2 and pp 2 (1F1B); an fp16 run whose loss scale overflows skips the
# same steps.  At dp 2 ZeRO-2 and ZeRO-3 with the whole shard offloaded the reduced
# gradient is accumulated on the host as each unit's reduction lands and its norm taken
# there, bitwise the device's (fp16's skips too, and a step whose gradient holds a NaN);
# the device memory then drops by 20 bytes a shard element less the landing areas, within
# 1%.  The device memory in use drops by the offloaded state, 12 bytes per
# parameter of the shard in bf16 (fp32 master, m, v) within 1%; an offloaded checkpoint
# resumes without offload, continuing bitwise.  parallel.offload_fraction = 0.5 (the last
# half of the shard, rounded up to 64 elements, on the host; the rest updated by the
# device) is bitwise equal to no offload too (one rank, dp 2 ZeRO-1, -2 and -3, bf16; fp32
# on one rank; a synchronous checkpoint write), its device memory drops by 12 bytes an
# offloaded element within 1% (at ZeRO-3, with that half's gradient on the host, also by
# its gradient and the landing area less the landing areas of the unit pieces), and
# checkpoints resume across fractions (0.5 -> 0.25 on one rank, 1 -> 0.5 and 0.5 -> none at
# dp 2 ZeRO-3), continuing bitwise.  The update cut into many pieces (TSR_FAULT
# offload_piece) is bitwise too: one rank in bf16 and fp32, dp 2 ZeRO-1 half offloaded, dp 2
# ZeRO-3, the unit's parts updated when the next forward first asks for them (and with a
# checkpoint and an evaluation after every step at ZeRO-1 and ZeRO-3: every checkpoint and
# every evaluation loss equal); and dp 4 as 2 shards x 2 replicas at ZeRO-3, the offloaded
# gradient all-reduced across the replicas on the host.  An offloaded dp 2 ZeRO-3
# checkpoint resumes as tp 2 offloaded, its next loss within 1% of the uninterrupted run's.  On the CPU the keys are accepted
# with one log line; a fraction outside [0, 1] is a deck error.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
emu_trainer_setup
# small shapes: the emulation runs every GPU thread as a CPU fiber
C=(model.vocab_size=256 model.n_layer=2 model.d_model=32 model.n_head=2 model.n_kv_head=1
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.log_every=1
  run.eval_every=0 optim.warmup_steps=4 optim.lr=3e-3 "data.train=$SCRATCH/data/train_*.bin"
  run.max_steps=2 checkpoint.every_steps=0 checkpoint.resume=none train.xent_chunk_tokens=8
  train.precision=bf16)
O=parallel.offload=optimizer
run() { emu_run "$@"; } # run NAME DEVICE NP ARGS... (tests/lib.sh)
pair() { # pair DESCRIPTION NAME NP ARGS...: without and with offload, compared bitwise
  local what=$1 name=$2 np=$3
  shift 3
  run "$name" cuda "$np" "$@"
  local r1=$?
  run "${name}_off" cuda "$np" "$@" $O
  local r2=$?
  check "$what: both run" test $r1 -eq 0 -a $r2 -eq 0
  [ $r1 -eq 0 ] || tail -5 "$SCRATCH/$name.out"
  [ $r2 -eq 0 ] || tail -5 "$SCRATCH/${name}_off.out"
  same_metrics "$name" "${name}_off"
  check "$what: losses and gradient norms bitwise equal with the optimizer offloaded" test $? -eq 0
  check "$what: the final checkpoints' weights and optimizer state are bitwise equal" \
    same_ckpt "$name" "${name}_off"
}
pair "bf16, one rank" b 1
check "the run says where the optimizer lives" grep -q "^offload: the optimizer's shard" \
  "$SCRATCH/b_off.out"
pair "fp32, one rank" f 1 train.precision=fp32
pair "bf16, dp 2 ZeRO-1" z1 2 parallel.zero_stage=1
pair "bf16, dp 2 ZeRO-3" z3 2 parallel.zero_stage=3
pair "bf16, tp 2" t2 2 parallel.tp=2
pair "bf16, pp 2 1F1B" p2 2 parallel.pp=2 parallel.schedule=1f1b
# fp16: a loss scale of 2^40 overflows the first steps, which are skipped and halve it
pair "fp16, loss scale overflowing" h 1 train.precision=fp16 train.loss_scale=1099511627776
s1=$(skips h) s2=$(skips h_off)
check "  ... both skip the same $s1 step(s) (at least one)" test "$s1" = "$s2" -a "$s1" -ge 1

# device memory: the bf16 shard's master, m and v (12 bytes a parameter) leave the device
mem() { sed -n 's/^memory at step 1, most on any rank: in use \([0-9.]*\) MB.*/\1/p' "$SCRATCH/$1.out" | head -1; }
nflat=$(sed -n 's/.*; \([0-9]*\) parameters (flat, padded).*/\1/p' "$SCRATCH/b.out" | head -1)
[ -n "$nflat" ] || nflat=$(sed -n 's/^model: llama, \([0-9]*\) parameters.*/\1/p' "$SCRATCH/b.out" | head -1)
m0=$(mem b) m1=$(mem b_off)
echo "    device memory in use: $m0 MB without, $m1 MB with the offload; $nflat parameters"
"$PYTHON_REF" -c "import sys; d = ($m0 - $m1) * 1e6; w = 12 * $nflat; sys.exit(0 if abs(d - w) <= 0.01 * w else 1)"
check "  ... it drops by 12 bytes a parameter ($m0 - $m1 MB against 12 x $nflat bytes, 1%)" \
  test $? -eq 0

# ZeRO-2 and -3 with the whole shard offloaded: the reduced gradient goes to the host as
# each unit's reduction lands (no gradient shard on the device), its norm is taken there
pair "bf16, dp 2 ZeRO-2" z2 2 parallel.zero_stage=2
check "  ... the reduced gradient lives on the host" grep -q \
  "shard of [0-9]* of [0-9]* elements; the reduced gradient on the host" "$SCRATCH/z2_off.out"
# 4 micro-batches a step: each unit's pieces reach the host on the copy queue and are
# added there micro-batch after micro-batch (the slots drained in turn)
pair "bf16, dp 2 ZeRO-3, 4 micro-batches a step" z3m 2 parallel.zero_stage=3 \
  train.global_batch=8
pair "fp16 overflowing, dp 2 ZeRO-3" h3 2 parallel.zero_stage=3 train.precision=fp16 \
  train.loss_scale=1099511627776
s1=$(skips h3) s2=$(skips h3_off)
check "  ... both skip the same $s1 step(s) (at least one)" test "$s1" = "$s2" -a "$s1" -ge 1
# device memory at ZeRO-3: master, m, v (12 B), the gradient shard and its landing area
# (8 B) a shard element leave, three landing areas of the largest unit piece (12 B) come
z3len=$(sed -n 's/.*(shard of \([0-9]*\) of [0-9]* elements.*/\1/p' "$SCRATCH/z3.out" | head -1)
land=$(sed -n 's/.*landing in \([0-9]*\) elements a gradient slot.*/\1/p' "$SCRATCH/z3_off.out" | head -1)
d0=$(mem z3) d1=$(mem z3_off)
echo "    dp 2 ZeRO-3 device memory in use: $d0 MB without, $d1 MB with the offload; shard $z3len, landing $land elements"
"$PYTHON_REF" -c "import sys; d = ($d0 - $d1) * 1e6; w = 20 * $z3len - 12 * $land; sys.exit(0 if abs(d - w) <= 0.01 * w else 1)"
check "  ... it drops by 20 B a shard element less 12 B a landing element (1%)" test $? -eq 0
# a NaN in the reduced gradient at step 2 (fault.h), dp 2 ZeRO-3: the norm taken on the
# host is non-finite and the step skipped, as on the device
export TSR_FAULT=nan_grad_step=2
pair "bf16, dp 2 ZeRO-3, a NaN gradient at step 2" n3 2 parallel.zero_stage=3 run.max_steps=3
unset TSR_FAULT
check "  ... both skip that step only" test "$(skips n3)" = 1 -a "$(skips n3_off)" = 1
check "  ... the offloaded run says so" grep -q "step 2: non-finite gradient norm; update skipped" \
  "$SCRATCH/n3_off.out"

# parallel.offload_fraction = 0.5 against the runs without offload above
F=parallel.offload_fraction=0.5
against() { # against DESCRIPTION BASE NAME NP ARGS...: NAME offloaded, against BASE
  local what=$1 base=$2 name=$3 np=$4
  shift 4
  run "$name" cuda "$np" "$@" $O
  local r=$?
  check "$what: it runs" test $r -eq 0
  [ $r -eq 0 ] || tail -5 "$SCRATCH/$name.out"
  same_metrics "$base" "$name"
  check "$what: losses and gradient norms bitwise equal to no offload" test $? -eq 0
  check "$what: the final checkpoints are bitwise equal" same_ckpt "$base" "$name"
}
half() { # half DESCRIPTION BASE NAME NP ARGS...: NAME with half offloaded, against BASE
  local what=$1
  shift
  against "$what, half offloaded" "$@" $F
}
half "bf16, one rank" b bh 1
check "  ... the run says which part is offloaded" grep -q \
  "^offload: the last 0.5 of the optimizer's shard (rounded up to 64 elements)" "$SCRATCH/bh.out"
half "fp32, one rank" f fh 1 train.precision=fp32
half "bf16, dp 2 ZeRO-1" z1 z1h 2 parallel.zero_stage=1
half "bf16, dp 2 ZeRO-3" z3 z3h 2 parallel.zero_stage=3
half "bf16, one rank, synchronous checkpoint" b bhs 1 checkpoint.async=.false.
half "bf16, dp 2 ZeRO-2" z2 z2h 2 parallel.zero_stage=2
# ZeRO-3 with half offloaded: that half's gradient on the host, the device keeping the
# other half's: master, m, v (12 B) and the gradient (4 B) of an offloaded element and the
# shard-long landing area (4 B a shard element) leave, three landing areas come (12 B)
land=$(sed -n 's/.*landing in \([0-9]*\) elements a gradient slot.*/\1/p' "$SCRATCH/z3h.out" | head -1)
offz=$("$PYTHON_REF" -c "import math; n = $z3len; print(min(n, math.ceil(0.5 * n / 64) * 64))")
d0=$(mem z3) d1=$(mem z3h)
echo "    dp 2 ZeRO-3 device memory in use: $d0 MB without, $d1 MB with half offloaded ($offz of $z3len elements, landing $land)"
"$PYTHON_REF" -c "import sys; d = ($d0 - $d1) * 1e6; w = 16 * $offz + 4 * $z3len - 12 * $land; sys.exit(0 if abs(d - w) <= 0.01 * w else 1)"
check "  ... it drops by 16 B an offloaded element and 4 B a shard element less 12 B a landing element (1%)" \
  test $? -eq 0
mh=$(mem bh)
off=$("$PYTHON_REF" -c "import math; n = $nflat; print(min(n, math.ceil(0.5 * n / 64) * 64))")
echo "    device memory in use: $m0 MB without, $mh MB with half offloaded ($off of $nflat elements)"
"$PYTHON_REF" -c "import sys; d = ($m0 - $mh) * 1e6; w = 12 * $off; sys.exit(0 if abs(d - w) <= 0.01 * w else 1)"
check "  ... it drops by 12 bytes an offloaded element ($m0 - $mh MB against 12 x $off bytes, 1%)" \
  test $? -eq 0

# The update in pieces (TSR_FAULT offload_piece: a few hundred elements instead of 2^21,
# so that these small shards are cut into many), each unit's part updated when the next
# forward first asks for the unit (ZeRO 1-2: and gathered then), each piece's compute copy
# queued back behind it.  Bitwise the runs without offload above.
export TSR_FAULT=offload_piece=1024
against "pieces of 1024, bf16, one rank" b bp 1
against "pieces of 1024, fp32, one rank" f fp 1 train.precision=fp32
against "pieces of 1024, bf16, dp 2 ZeRO-1, half offloaded" z1 z1p 2 parallel.zero_stage=1 $F
export TSR_FAULT=offload_piece=256
against "pieces of 256, bf16, dp 2 ZeRO-3, 4 micro-batches a step" z3m z3mp 2 \
  parallel.zero_stage=3 train.global_batch=8
check "  ... the run says the update waits for the next forward" grep -q \
  "each unit's part when the next forward first needs the unit" \
  "$SCRATCH/z3mp.out"
# a checkpoint and an evaluation after every step of ZeRO-3: both read the last update
# (the checkpoint completes what the forward has not yet asked for)
E=(parallel.zero_stage=3 run.max_steps=3 checkpoint.every_steps=1 checkpoint.keep=0
  run.eval_every=1 run.eval_steps=1 "data.valid=$SCRATCH/data/valid_*.bin")
unset TSR_FAULT
run ze cuda 2 "${E[@]}"
check "ZeRO-3, a checkpoint and an evaluation every step: runs without offload" test $? -eq 0
export TSR_FAULT=offload_piece=256
against "ZeRO-3, a checkpoint and an evaluation every step" ze zep 2 "${E[@]}"
unset TSR_FAULT
same_step_ckpts() { # every step's checkpoint of runs A and B equal
  local a b ok=0 n=0
  for a in "$SCRATCH/$1"/ckpt/step_*.h5; do
    b="$SCRATCH/$2/ckpt/$(basename "$a")"
    n=$((n + 1))
    same_ckpt_file "$a" "$b" || ok=1
  done
  echo "    $n checkpoints compared"
  [ $n -eq 3 ] && return $ok
}
check "  ... every step's checkpoint bitwise equal" same_step_ckpts ze zep
evals() { "$PYTHON_REF" -c "import json,sys; print([repr(d['val_loss']) for d in map(json.loads, open(sys.argv[1])) if 'val_loss' in d])" "$SCRATCH/$1/metrics.jsonl"; }
e1=$(evals ze) e2=$(evals zep)
echo "    evaluation losses: $e1 | $e2"
check "  ... every evaluation loss bitwise equal (3 of them)" test "$e1" = "$e2" -a "$(echo "$e1" | tr -cd ',' | wc -c)" -eq 2
# the same at ZeRO-1, where each unit is gathered when the forward first asks for it
E[0]=parallel.zero_stage=1
run ze1 cuda 2 "${E[@]}"
check "ZeRO-1, a checkpoint and an evaluation every step: runs without offload" test $? -eq 0
export TSR_FAULT=offload_piece=256
against "ZeRO-1, a checkpoint and an evaluation every step" ze1 ze1p 2 "${E[@]}"
unset TSR_FAULT
check "  ... every step's checkpoint bitwise equal" same_step_ckpts ze1 ze1p
e1=$(evals ze1) e2=$(evals ze1p)
check "  ... every evaluation loss bitwise equal (3 of them)" test "$e1" = "$e2" -a "$(echo "$e1" | tr -cd ',' | wc -c)" -eq 2
# hybrid sharding: dp 4 as 2 shards x 2 replicas at ZeRO-3; the offloaded part's reduced
# gradient on the host, all-reduced across the replicas there
pair "bf16, dp 4 = 2 shards x 2 replicas, ZeRO-3" hy 4 parallel.zero_stage=3 \
  parallel.shard_scope=2 train.global_batch=4
check "  ... the reduced gradient lives on the host" grep -q \
  "shard of [0-9]* of [0-9]* elements; the reduced gradient on the host" "$SCRATCH/hy_off.out"

# resumes across fractions, continuing the runs that never stopped
run rh cuda 1 run.max_steps=1 $O $F
run rh cuda 1 checkpoint.resume=auto $O parallel.offload_fraction=0.25
check "a checkpoint written with half offloaded resumes with a quarter" \
  grep -q "resumed from .*step_00000001.h5 at step 1" "$SCRATCH/rh.out"
same_metrics b rh
check "  ... and continues bitwise" test $? -eq 0
run r3 cuda 2 parallel.zero_stage=3 run.max_steps=1 $O
run r3 cuda 2 parallel.zero_stage=3 checkpoint.resume=auto $O $F
check "dp 2 ZeRO-3: a checkpoint written with all offloaded resumes with half" \
  grep -q "resumed from .*step_00000001.h5 at step 1" "$SCRATCH/r3.out"
same_metrics z3 r3
check "  ... and continues bitwise" test $? -eq 0
run r3h cuda 2 parallel.zero_stage=3 run.max_steps=1 $O $F
run r3h cuda 2 parallel.zero_stage=3 checkpoint.resume=auto
check "dp 2 ZeRO-3: a checkpoint written with half offloaded resumes without offload" \
  grep -q "resumed from .*step_00000001.h5 at step 1" "$SCRATCH/r3h.out"
same_metrics z3 r3h
check "  ... and continues bitwise" test $? -eq 0

# on another layout: dp 2 ZeRO-3 offloaded, resumed as tp 2 (ZeRO 0) offloaded
run rl cuda 2 parallel.zero_stage=3 run.max_steps=1 $O
run rl cuda 2 parallel.tp=2 checkpoint.resume=auto $O
check "dp 2 ZeRO-3 offloaded resumes as tp 2 offloaded" \
  grep -q "resumed from .*step_00000001.h5 at step 1" "$SCRATCH/rl.out"
check "  ... its step 2 loss within 1% of the dp 2 run's that never stopped" \
  "$PYTHON_REF" - "$SCRATCH/z3/metrics.jsonl" "$SCRATCH/rl/metrics.jsonl" <<'PY'
import json, sys
a, b = ([d['loss'] for d in map(json.loads, open(p)) if d.get('step') == 2 and 'loss' in d]
        for p in sys.argv[1:])
print(f"    step 2: {a} | {b}")
sys.exit(0 if len(a) == 1 and len(b) == 1 and abs(a[0] - b[0]) <= 0.01 * abs(a[0]) else 1)
PY

# an offloaded checkpoint resumes without offload, continuing the run that never stopped
run rs cuda 1 run.max_steps=1 $O
run rs cuda 1 checkpoint.resume=auto
check "a checkpoint written with the offload resumes without it" \
  grep -q "resumed from .*step_00000001.h5 at step 1" "$SCRATCH/rs.out"
same_metrics b rs
check "  ... and continues bitwise" test $? -eq 0

# the CPU, and a fraction out of range
run cpu cpu 1 $O train.activation_offload=.true. run.max_steps=1
check "on the CPU the keys are accepted, saying there is nothing to move" grep -q \
  "^offload: this run is on the CPU.*parallel.offload = 'optimizer' and train.activation_offload = .true. has nothing to move" \
  "$SCRATCH/cpu.out"
run frac2 cpu 1 $O parallel.offload_fraction=1.5
check "a fraction above 1: exit 2" test $? -eq 2
check "  ... at the key's place on the command line" grep -q \
  "<command line>:arg.*parallel.offload_fraction" "$SCRATCH/frac2.out"
finish
