#!/usr/bin/env bash
# plan.sh — `tessera plan` against the real trainer, and the command's outputs.
#  1. The trainer runs one step of the tiny deck and of gpt2_124m (both shrunk by overrides:
#     short sequences, small batches, gpt2 with 2 narrow layers and a 512-row vocabulary;
#     it keeps gpt2's learned positions, LayerNorm, biases and tied head) under 1 rank,
#     dp 2 with ZeRO 1 and 3, tp 2 (gpt2: with sequence parallelism and selective
#     recompute) and pp 2 (gpt2: ZeRO 2 with the tied head's copy), and logs the memory it
#     measured after step 1 (bytes held through tsr_calloc, in use and peak since start,
#     the most on any rank).  `tessera plan` for the same deck, overrides and number of
#     ranks (--nodes 1 --gpus-per-node NP), this build's figure, must be within 10% of both (measured: within 0.2%; the rest is communicator and data-reader
#     bookkeeping the planner does not count).  Rank 0's bytes per group and kind in step 1
#     (the trainer's "comm per step" line, MB to 3 decimals) must equal the plan's traffic
#     of stage 0.
#     The same for the tiny deck in bf16 and fp16 (1 rank, tp 2, pp 2; gpt2_124m is bf16
#     already: fp16 on tp 2 and fp32 on 1 rank), and on the
#     tiny deck at micro_batch 16 a bf16 step holds at most 0.65x the fp32 step's bytes and within
#     10% of the plan's GPU figure.
#  2. --json parses (python3 -m json.tool) for llm70b on 64 x 8 and for the search.
#  3. --search ranks layouts of llm70b on 64 nodes x 8 GPUs that fit in memory.
#  4. In bf16 the GPU workspace counts cuDNN attention's workspace (exact bytes), the
#     default GPU build's attention: with TSR_CUDA_ATTENTION unset or cudnn, not with mma.
#  5. A layout that does not divide fails with exit 2 and names the keys and numbers; so
#     does a machine of more than INT_MAX GPUs (nodes x GPUs per node in 64 bits).
#  6. FLOPs in the JSON: model FLOPs the same for every recompute mode and equal to the
#     executed FLOPs without recomputation; selective adds none (it rebuilds element-wise
#     work only); full adds the layers' forward, counted by hand from llm70b's shapes.
#  7. Sizing: --require-fit exits 3 when the plan does not fit and 0 when it does (0 either
#     way without it); --max-mem-frac turns llm70b's own layout (41.5 GB with the reserve)
#     from fitting in 80 GB to not fitting in 0.5 x 80 GB, as peak + reserve against
#     F x HBM from the JSON says; bad fractions exit 2.
#  8. Keys given on the command line hold the search: with parallel.tp=8,
#     train.recompute=full and parallel.zero_stage=3 every listed layout has them, the
#     output names them, and the layouts are exactly the unconstrained search's fitting
#     layouts with those values; a value the search would not try (virtual_stages 4) is
#     honoured too, and one the deck's own layout does not go with (pp 16 against its 2
#     chunks of 80 layers) still gives a search.
#  9. When nothing fits: a constructed case (the tiny deck with 6 layers on 1-GPU nodes of
#     12 MB) names the smallest node count that fits, equal to the first count with a
#     fitting layout found by searching each count in turn.  Memory does not fall
#     steadily with more nodes there (the least on 3 nodes is 14.2 MB, on 4 15.7, on 6
#     11.5, on 8 13.1, on 16 11.9; on 5 nothing divides), so doubling the node count and
#     halving back would answer 12, not 6.  A GPU too small for any count says so up to
#     where layouts stop dividing, or up to the scan's bound of 65536 nodes;
#     --search --require-fit exits 3 then.
# 10. The time model's JSON (docs/architecture.md "The planner's time model"): TFLOP/s per
#     GPU and MFU follow from the simulated step, which is the last reduction's end plus
#     the tail; every stage has its replayed idle fraction; the reference stack plans a
#     faster step than Tessera's kernels.  (The replay itself: tests/unit/plan/test_plan_sim.c.)
# 11. Profiles: what --print-profile prints, read back with --profile, plans the same step;
#     a GEMM rate halved in the file plans a slower one; bad files and implementations
#     exit 2.
# 12. --hardware cpu measures this host when it starts (positive rates; no time is
#     checked), and its printed profile reads back.
# 13. When nothing fits, the search lists the layouts closest to fitting, each marked NO
#     with its shortfall, then the closest one's shortfall in GB per GPU and what would
#     close it: llm70b on one node of 8 H100s without the offloads (held off by
#     parallel.offload=none train.activation_offload=F; tests/e2e/plan_offload.sh searches
#     with them) is short by about 79 GB: no memory key helps, the optimizer offload or 4
#     nodes do; with recompute and micro_batch held on a small GPU (and the activation
#     offload held off), releasing either one closes it.  A deck of 131072-token sequences (134 M tokens a step) is warned
#     about, with the numbers, by the planner and at the start of a run.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers

T=(run.max_steps=1 run.eval_every=0 run.log_every=1 "data.train=$SCRATCH/data/train_*.bin"
  data.valid= checkpoint.resume=none checkpoint.every_steps=0 checkpoint.keep=1)
TINY=(model.seq_len=64 train.micro_batch=4 train.global_batch=8)
GPT2=(model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=4 model.d_ff=256
  model.vocab_size=512 model.seq_len=64 train.micro_batch=2 train.global_batch=8)
ROWS="$SCRATCH/rows.txt"
: >"$ROWS"

compare() { # compare NAME: planned (NAME.json) against measured (NAME.log)
  "$PYTHON_REF" - "$SCRATCH/$1.log" "$SCRATCH/$1.json" "$1" "$ROWS" <<'PY'
import json, re, sys
log, plan, name = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), sys.argv[3]
m = re.search(r"memory at step 1, most on any rank: in use ([0-9.]+) MB, peak ([0-9.]+) MB", log)
if not m:
    print("    no memory line in the trainer's log"); sys.exit(1)
use, peak = float(m.group(1)) * 1e6, float(m.group(2)) * 1e6
cpu = [s["memory_cpu_build"] for s in plan["stages"]]
p_use, p_peak = max(c["total"] for c in cpu), max(c["peak"] for c in cpu)
d_use, d_peak = p_use / use - 1, p_peak / peak - 1
with open(sys.argv[4], "a") as f:
    f.write(f"  {name:<20} {p_use/1e6:10.3f} {use/1e6:10.3f} {100*d_use:+7.2f}% "
            f"{p_peak/1e6:10.3f} {peak/1e6:10.3f} {100*d_peak:+7.2f}%\n")
ok = abs(d_use) <= 0.10 and abs(d_peak) <= 0.10
# traffic: every group and kind of rank 0's line against the plan's stage 0 (3 decimals)
c = re.search(r"comm per step \(rank 0, ring-algorithm bytes\): (.*)", log)
logged = {}
for grp in (c.group(1).split("; ") if c else []):
    g, rest = grp.split(" ", 1)
    for kind, mb in re.findall(r"(\w+) ([0-9.]+)", rest.split("(", 1)[1]):
        if kind != "scalar" and float(mb) > 0:
            logged[(g, kind)] = float(mb)
planned = {(g, k): v / 1e6 for g, t in plan["stages"][0]["traffic"].items() for k, v in t.items()
           if k not in ("size", "link", "bytes", "scalar") and v > 0 and g != "embed_tied"}
for key in sorted(set(logged) | set(planned)):
    if abs(logged.get(key, 0) - planned.get(key, 0)) > 0.0015:
        print(f"    traffic {key}: trainer {logged.get(key, 0):.3f} MB, plan {planned.get(key, 0):.4f} MB")
        ok = False
print(f"    {name}: planned {p_use/1e6:.3f} MB in use ({100*d_use:+.2f}%), {p_peak/1e6:.3f} MB peak "
      f"({100*d_peak:+.2f}%); traffic: {len(logged)} group/kind counts compared")
sys.exit(0 if ok else 1)
PY
}

layout() { # layout NAME DECK NP overrides...: train one step, plan it, compare
  local name=$1 deck="$top_srcdir/input/$2.nml" np=$3
  shift 3
  if ! timeout 120 "$MPIRUN" -np "$np" "$TESSERA" "$deck" "${T[@]}" "$@" \
      run.out_dir="$SCRATCH/$name" >"$SCRATCH/$name.log" 2>&1; then
    tail -n 5 "$SCRATCH/$name.log"
    bad "$name: the trainer failed"
    return
  fi
  if ! "$TESSERA" plan "$deck" --nodes 1 --gpus-per-node "$np" --json "${T[@]}" "$@" \
      >"$SCRATCH/$name.json" 2>"$SCRATCH/$name.err"; then
    cat "$SCRATCH/$name.err"
    bad "$name: tessera plan failed"
    return
  fi
  check "$name: planned memory within 10% of the measured, traffic equal" compare "$name"
}

layout tiny_1rank tiny 1 "${TINY[@]}"
layout tiny_dp2_zero1 tiny 2 "${TINY[@]}" parallel.zero_stage=1
layout tiny_dp2_zero3 tiny 2 "${TINY[@]}" parallel.zero_stage=3
layout tiny_tp2 tiny 2 "${TINY[@]}" parallel.tp=2
layout tiny_pp2 tiny 2 "${TINY[@]}" parallel.pp=2
layout gpt2_1rank gpt2_124m 1 "${GPT2[@]}"
layout gpt2_dp2_zero3 gpt2_124m 2 "${GPT2[@]}" parallel.zero_stage=3
layout gpt2_tp2_sp gpt2_124m 2 "${GPT2[@]}" parallel.zero_stage=0 parallel.tp=2 \
  parallel.sequence_parallel=.true. train.recompute=selective
layout gpt2_pp2_zero2 gpt2_124m 2 "${GPT2[@]}" parallel.pp=2 parallel.zero_stage=2
layout tiny_1rank_bf16 tiny 1 "${TINY[@]}" train.precision=bf16
layout tiny_tp2_bf16 tiny 2 "${TINY[@]}" parallel.tp=2 train.precision=bf16
layout tiny_pp2_fp16 tiny 2 "${TINY[@]}" parallel.pp=2 train.precision=fp16
layout gpt2_tp2_fp16 gpt2_124m 2 "${GPT2[@]}" parallel.tp=2 train.precision=fp16
layout gpt2_1rank_fp32 gpt2_124m 1 "${GPT2[@]}" train.precision=fp32
echo "  layout               planned MB measured MB   diff    plan peak  meas. peak   diff"
cat "$ROWS"

# 16-bit storage on the tiny deck at micro_batch 16, where the activations are most of the
# memory (one step, one rank): the bf16 run holds at
# most 0.65x the fp32 run's bytes (mem_bytes of metrics.jsonl), and its measured memory is
# within 10% of what the planner gives for a GPU (the same storage: 2-byte parameters,
# activations and activation gradients; fp32 gradients, master and Adam)
for p in fp32 bf16; do
  timeout 120 "$TESSERA" "$top_srcdir/input/tiny.nml" "${T[@]}" train.precision=$p \
    train.micro_batch=16 run.out_dir="$SCRATCH/mem_$p" >"$SCRATCH/mem_$p.log" 2>&1 || bad "tiny $p: the trainer failed"
  "$TESSERA" plan "$top_srcdir/input/tiny.nml" --nodes 1 --gpus-per-node 1 --json "${T[@]}" \
    train.precision=$p train.micro_batch=16 >"$SCRATCH/mem_$p.json" 2>&1 || bad "tiny $p: tessera plan failed"
done
check "tiny deck, micro_batch 16: bf16 memory <= 0.65 x fp32's, and within 10% of the plan's GPU figure" \
  "$PYTHON_REF" - "$SCRATCH" <<'PY'
import json, sys
d = sys.argv[1]
mem = {p: [json.loads(l) for l in open(f"{d}/mem_{p}/metrics.jsonl") if '"loss"' in l][0]["mem_bytes"]
       for p in ("fp32", "bf16")}
gpu = json.load(open(f"{d}/mem_bf16.json"))["stages"][0]["memory_gpu"]["total"]
ratio, off = mem["bf16"] / mem["fp32"], mem["bf16"] / gpu - 1
print(f"    mem_bytes fp32 {mem['fp32']/1e6:.2f} MB, bf16 {mem['bf16']/1e6:.2f} MB: {ratio:.3f}x; "
      f"planned on a GPU {gpu/1e6:.2f} MB ({100*off:+.2f}%)")
sys.exit(0 if ratio <= 0.65 and abs(off) <= 0.10 else 1)
PY

# --json and --search on the shipped 70B deck
big="$top_srcdir/input/llm70b.nml"
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --json >"$SCRATCH/70b.json" 2>&1
check "plan --json of llm70b on 64 x 8 parses" "$PYTHON_REF" -m json.tool "$SCRATCH/70b.json" /dev/null
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 >"$SCRATCH/70b.txt" 2>&1
check "the table of llm70b on 64 x 8 has the memory, traffic and time sections" \
  grep -q "predicted step" "$SCRATCH/70b.txt"
sed -n '/^memory per GPU/,/fits:/p' "$SCRATCH/70b.txt"
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --search --top 5 >"$SCRATCH/search.txt" 2>&1
rc=$?
cat "$SCRATCH/search.txt"
ranked=$(sed -n '/^ *rank /,/own layout/p' "$SCRATCH/search.txt" | grep -cE '^ +[0-9]+ +[0-9]+ +[0-9]+ ')
check "plan --search lists the 5 fastest layouts of llm70b on 64 x 8 that fit, then the deck's" \
  test $rc -eq 0 -a "$ranked" -eq 5 -a -n "$(grep "the deck's own layout (fits" "$SCRATCH/search.txt")"
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --search --json >"$SCRATCH/search.json" 2>&1
check "plan --search --json parses, every listed layout fits" "$PYTHON_REF" -c "
import json, sys
d = json.load(open(sys.argv[1]))['search']
sys.exit(0 if d['layouts'] and all(l['fits'] for l in d['layouts']) else 1)" "$SCRATCH/search.json"

# In bf16 the GPU workspace counts cuDNN attention's workspace, the default attention
# (TSR_CUDA_ATTENTION unset, or empty as here, or cudnn), unless TSR_CUDA_ATTENTION=mma
# asks for our kernels (src/ops/ops.h, tsr_ops_cudnn_attention_workspace_bytes: its
# deterministic backward's dP, 2 B H T'^2 bytes with T' = T rounded up to 128, an fp32 dq
# accumulator, 4 B H T hd, two floats per query row, 8 B H T, and 1024): gpt2 narrowed to
# B 2, H 4, T 64, hd 16 gives 2*8*128^2 + 4*512*16 + 8*512 + 1024 = 300032 bytes more.
NARROW=(model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=4 model.d_ff=256
  model.vocab_size=256 model.seq_len=64 train.micro_batch=2 train.global_batch=8
  train.precision=bf16)
for a in mma cudnn ""; do
  TSR_CUDA_ATTENTION=$a "$TESSERA" plan "$top_srcdir/input/gpt2_124m.nml" --nodes 1 \
    --gpus-per-node 1 --json "${NARROW[@]}" >"$SCRATCH/ws_${a:-default}.json" 2>&1
done
check "plan: cuDNN attention's workspace (300032 bytes here) by default and with cudnn, not mma" \
  "$PYTHON_REF" -c "
import json, sys
w = [json.load(open(f))['stages'][0]['memory_gpu']['workspace'] for f in sys.argv[1:4]]
print('    GPU workspace: mma', w[0], 'cudnn', w[1], 'unset', w[2], 'bytes')
B, H, T, hd = 2, 4, 64, 16
Tp = (T + 127) // 128 * 128
sys.exit(0 if w[1] - w[0] == 2 * B * H * Tp * Tp + 4 * B * H * T * hd + 8 * B * H * T + 1024
         and w[2] == w[1] else 1)" \
  "$SCRATCH/ws_mma.json" "$SCRATCH/ws_cudnn.json" "$SCRATCH/ws_default.json"

# layouts that do not divide: exit 2, naming the keys and their values
"$TESSERA" plan "$top_srcdir/input/llm7b.nml" --nodes 8 parallel.tp=16 >"$SCRATCH/bad.txt" 2>&1
rc=$?
cat "$SCRATCH/bad.txt"
check "tp 16 on 8-GPU nodes: exit 2, 'parallel.tp = 16 is larger than the 8 ranks per node'" \
  test $rc -eq 2 -a -n "$(grep 'parallel.tp = 16 is larger than the 8 ranks per node' "$SCRATCH/bad.txt")"
"$TESSERA" plan "$top_srcdir/input/llm7b.nml" --nodes 8 parallel.tp=3 >"$SCRATCH/bad3.txt" 2>&1
rc=$?
check "tp 3: exit 2, 'parallel.tp = 3 does not divide model.n_head = 32'" \
  test $rc -eq 2 -a -n "$(grep 'parallel.tp = 3 does not divide model.n_head = 32' "$SCRATCH/bad3.txt")"
# 1e6 nodes x 4096 GPUs = 4.096e9 > INT_MAX (2^31 - 1): refused, not wrapped round in an int
"$TESSERA" plan "$top_srcdir/input/llm7b.nml" --nodes 1000000 --gpus-per-node 4096 \
  >"$SCRATCH/huge.txt" 2>&1
rc=$?
cat "$SCRATCH/huge.txt"
check "1e6 nodes x 4096 GPUs: exit 2, names --nodes and --gpus-per-node and 4096000000 GPUs" \
  test $rc -eq 2 -a -n "$(grep -e '--nodes 1000000 x --gpus-per-node 4096 .* = 4096000000 GPUs' \
  "$SCRATCH/huge.txt")"

# ---- 6. FLOPs: model = 3 x forward in every recompute mode; executed = model + recompute
for r in none selective full; do
  "$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --json train.recompute=$r \
    >"$SCRATCH/flops_$r.json" 2>&1
done
check "llm70b FLOPs: model the same in every mode = executed('none'); selective adds 0; full the layers' forward" \
  "$PYTHON_REF" -c "
import json, sys
f = {r: json.load(open(f'{sys.argv[1]}/flops_{r}.json'))['flops'] for r in ('none', 'selective', 'full')}
L, C, H, KV, hd, F, V, T, tokens = 80, 8192, 64, 8, 128, 28672, 32000, 4096, 1024 * 4096
layer = C * (H + 2 * KV) * hd + H * hd * C + 3 * C * F      # wqkv, wo, gate, up, down
core = 2 * T * C                                          # causal QK^T and PV forward, per token
forward = (2 * (L * layer + V * C) + L * core) * tokens   # the embedding lookup costs none
layers_fwd = (2 * L * layer + L * core) * tokens
close = lambda a, b: abs(a - b) <= 1e-9 * abs(b)
for r, x in f.items():
    print(f'    {r:9}: model {x[\"model\"]/1e15:.2f}, executed {x[\"executed\"]/1e15:.2f}, recompute '
          f'{x[\"recompute\"]/1e15:.2f} PFLOP')
print(f'    by hand: model {3*forward/1e15:.2f}, the layers forward {layers_fwd/1e15:.2f} PFLOP')
ok = all(close(x['model'], 3 * forward) and close(x['forward'], forward) and
         close(x['attention'], 3 * L * core * tokens) for x in f.values())
ok &= close(f['none']['executed'], f['none']['model']) and f['none']['recompute'] == 0
ok &= f['selective']['executed'] == f['none']['executed'] and f['selective']['recompute'] == 0
ok &= close(f['full']['executed'] - f['none']['executed'], layers_fwd)
ok &= close(f['full']['recompute'], layers_fwd)
sys.exit(0 if ok else 1)" "$SCRATCH"

# ---- 7. --require-fit and --max-mem-frac
for args in "1 fit" "0.5 nofit"; do
  set -- $args
  "$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --max-mem-frac $1 --json \
    >"$SCRATCH/$2.json" 2>/dev/null
  echo $? >"$SCRATCH/$2.rc"
  "$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --max-mem-frac $1 --require-fit \
    >"$SCRATCH/$2.txt" 2>&1
  echo $? >"$SCRATCH/$2.rc_req"
done
grep "fits:" "$SCRATCH/fit.txt" "$SCRATCH/nofit.txt"
codes=$(cat "$SCRATCH"/fit.rc_req "$SCRATCH"/nofit.rc_req "$SCRATCH"/fit.rc "$SCRATCH"/nofit.rc)
check "llm70b 64 x 8: --require-fit exits 0 when it fits, 3 at --max-mem-frac 0.5; 0 without it" \
  test "$(echo $codes)" = "0 3 0 0"
check "  ... and the tables say 'fits: yes' and 'fits: NO' (against 0.5 x 80 GB = 40 GB)" \
  grep -q "fits: NO (peak .* against 0.5 x 80 GB = 40 GB" "$SCRATCH/nofit.txt"
check "  ... and the verdicts are peak + reserve <= F x HBM of the JSON, and they differ" \
  "$PYTHON_REF" -c "
import json, sys
v = []
for f in sys.argv[1:]:
    d = json.load(open(f))
    m, mem = d['machine'], d['memory']
    need = mem['gpu']['peak'] + m['reserved_gb'] * 1e9
    room = m['max_mem_frac'] * m['hbm_gb'] * 1e9
    print(f'    {f.split(\"/\")[-1]}: {need/1e9:.2f} GB against {room/1e9:.1f} GB: fits {mem[\"fits\"]}')
    if mem['fits'] != (need <= room): sys.exit(1)
    v.append(mem['fits'])
sys.exit(0 if v == [True, False] else 1)" "$SCRATCH/fit.json" "$SCRATCH/nofit.json"
badfrac=""
for f in 0 1.5 -0.2 abc ""; do
  "$TESSERA" plan "$big" --nodes 64 --max-mem-frac="$f" >"$SCRATCH/frac.txt" 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "max-mem-frac" "$SCRATCH/frac.txt" || badfrac="$badfrac '$f':$rc"
done
check "--max-mem-frac 0, 1.5, -0.2, abc, empty: exit 2 naming the option${badfrac:+ (not:$badfrac)}" \
  test -z "$badfrac"

# ---- 8. command-line keys hold the search
FIX=(parallel.tp=8 train.recompute=full parallel.zero_stage=3)
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --search --json --top 100000 \
  >"$SCRATCH/all.json" 2>&1
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --search --json --top 100000 "${FIX[@]}" \
  >"$SCRATCH/held.json" 2>&1
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --search --top 3 "${FIX[@]}" \
  >"$SCRATCH/held.txt" 2>&1
head -n 3 "$SCRATCH/held.txt"
check "search with ${FIX[*]}: every layout has them, and they are the unconstrained search's" \
  "$PYTHON_REF" -c "
import json, sys
a, h = (json.load(open(f))['search'] for f in sys.argv[1:3])
want = {'parallel.tp': '8', 'train.recompute': 'full', 'parallel.zero_stage': '3'}
row = lambda l: tuple(l[k] for k in ('tp', 'pp', 'virtual_stages', 'dp', 'zero_stage', 'shard',
                                     'micro_batch', 'recompute', 'memory_gb', 'step_s'))
held = sorted(map(row, h['layouts']))
free = sorted(row(l) for l in a['layouts']
              if l['tp'] == 8 and l['recompute'] == 'full' and l['zero_stage'] == 3)
other = sum(l['tp'] != 8 or l['recompute'] != 'full' or l['zero_stage'] != 3 for l in a['layouts'])
print(f'    held: {len(held)} layouts fit of {h[\"divide\"]}; unconstrained: {len(a[\"layouts\"])} '
      f'fit, {len(free)} with those values, {other} others')
sys.exit(0 if h['fixed'] == want and held and held == free and other > 0 and
         len(held) == h['fit'] else 1)" "$SCRATCH/all.json" "$SCRATCH/held.json"
check "  ... the table names them: 'held fixed by the command line: parallel.tp = 8, ...'" \
  grep -q "^held fixed by the command line: parallel.tp = 8, parallel.zero_stage = 3, train.recompute = 'full'" \
  "$SCRATCH/held.txt"
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --search --json --top 100000 >"$SCRATCH/zb.json" 2>&1
check "the search tries the zero-bubble zb_h1 (recompute 'none' only) beside 1f1b and interleaved" \
  "$PYTHON_REF" -c "
import json, sys
L = json.load(open(sys.argv[1]))['search']['layouts']
by = {}
for l in L: by.setdefault(l['schedule'], []).append(l)
print('    schedules:', {k: len(v) for k, v in by.items()})
zb = by.get('zb_h1', [])
sys.exit(0 if zb and {l['recompute'] for l in zb} == {'none'} and all(l['virtual_stages'] == 1 and l['pp'] > 1 for l in zb)
         and '1f1b' in by and 'interleaved' in by else 1)" "$SCRATCH/zb.json"
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --search --json --top 100000 \
  parallel.virtual_stages=4 >"$SCRATCH/v4.json" 2>&1
check "search with parallel.virtual_stages=4 (the search tries 1 and 2): every layout has 4" \
  "$PYTHON_REF" -c "
import json, sys
d = json.load(open(sys.argv[1]))['search']
print(f'    {d[\"fit\"]} fit, pp', sorted({l['pp'] for l in d['layouts']}))
sys.exit(0 if d['layouts'] and all(l['virtual_stages'] == 4 and l['pp'] > 1
                                   for l in d['layouts']) else 1)" "$SCRATCH/v4.json"
# the deck's 2 chunks of 80 layers do not go with 16 stages: the search still runs
"$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --search --top 100000 parallel.pp=16 \
  >"$SCRATCH/pp16.txt" 2>&1
rc=$?
rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +[0-9]+ ' "$SCRATCH/pp16.txt")
other=$(grep -E '^ +[0-9]+ +[0-9]+ +[0-9]+ ' "$SCRATCH/pp16.txt" | awk '$3 != 16' | wc -l)
check "search with parallel.pp=16 against the deck's virtual_stages 2: exit 0, $rows layouts, all pp 16" \
  test $rc -eq 0 -a "$rows" -gt 0 -a "$other" -eq 0 -a \
  -n "$(grep "the deck's own layout is not valid with these overrides" "$SCRATCH/pp16.txt")"

# ---- 9. nothing fits: the smallest node count that does
HW=(--hardware custom hardware.peak_tflops=100 hardware.peak_fp32_tflops=10 hardware.hbm_gbps=1000
  hardware.intra_node_gbps=100 hardware.inter_node_gbps=10 hardware.gpus_per_node=1
  hardware.reserved_gb=0)
tiny="$top_srcdir/input/tiny.nml"
SIX=("${HW[@]}" hardware.hbm_gb=0.012 model.n_layer=6 parallel.offload=none) # no offload
fits_on() { # fits_on NODES: how many layouts the search finds fitting ("" on failure)
  "$TESSERA" plan "$tiny" --nodes "$1" --search --json "${SIX[@]}" 2>/dev/null |
    "$PYTHON_REF" -c "import json, sys; print(json.load(sys.stdin)['search']['fit'])"
}
"$TESSERA" plan "$tiny" --search "${SIX[@]}" >"$SCRATCH/small.txt" 2>&1
rc=$?
"$TESSERA" plan "$tiny" --search --require-fit "${SIX[@]}" >/dev/null 2>&1
rc_req=$?
"$TESSERA" plan "$tiny" --search --json "${SIX[@]}" >"$SCRATCH/small.json" 2>&1
cat "$SCRATCH/small.txt"
first=0 counts=""
for n in $(seq 2 16); do # each node count in turn, independently
  f=$(fits_on $n)
  counts="$counts $n:$f"
  [ "${f:-0}" -gt 0 ] && { first=$n; break; }
done
echo "    layouts that fit by node count:$counts"
check "tiny, 6 layers, on 1-GPU nodes of 12 MB: nothing fits on 1; the smallest count that fits is $first" \
  grep -q "^nothing fits on 1 node(s) x 1 GPUs; the smallest node count that fits is $first (" \
  "$SCRATCH/small.txt"
check "  ... the JSON says the same, with a fitting layout there; exit 0, 3 with --require-fit" \
  "$PYTHON_REF" -c "
import json, sys
l = json.load(open(sys.argv[1]))['search']['larger']
sys.exit(0 if l['smallest_nodes'] == int(sys.argv[2]) > 1 and l['fastest']['fits'] and
         l['fit'] > 0 and sys.argv[3:] == ['0', '3'] else 1)" "$SCRATCH/small.json" "$first" $rc $rc_req
"$TESSERA" plan "$tiny" --search --require-fit "${HW[@]}" hardware.hbm_gb=0.005 >"$SCRATCH/none.txt" 2>&1
rc=$?
grep "^nothing fits" "$SCRATCH/none.txt"
none="nothing fits on 1 node(s) x 1 GPUs, nor on any node count up to 64 (beyond it no layout"
check "tiny on 5 MB GPUs: nothing fits up to 64 nodes, beyond which no layout divides; exit 3" \
  test $rc -eq 3 -a -n "$(grep "^$none divides)" "$SCRATCH/none.txt")"
check "  ... and on 64 nodes some layout divides, on 128 none" "$PYTHON_REF" -c "
import json, subprocess, sys
d = [json.loads(subprocess.run(sys.argv[1:] + ['--nodes', n], capture_output=True, text=True).stdout)
     ['search']['divide'] for n in ('64', '128')]
print('    layouts that divide on 64 and 128 nodes:', d)
sys.exit(0 if d[0] > 0 and d[1] == 0 else 1)" "$TESSERA" plan "$tiny" --search --json "${HW[@]}" hardware.hbm_gb=0.005
"$TESSERA" plan "$tiny" --search "${HW[@]}" hardware.hbm_gb=0.001 train.global_batch=1048576 \
  >"$SCRATCH/bound.txt" 2>&1
grep "^nothing fits" "$SCRATCH/bound.txt"
check "with 2^20 sequences a batch, the scan stops at its bound: 'up to 65536 (the scan's bound)'" \
  grep -q "nor on any node count up to 65536 (the scan's bound)" "$SCRATCH/bound.txt"
# ---- 10. the time model's JSON (src/plan/plan_sim.c): TFLOP/s per GPU and MFU from the step,
# the step = the last reduction's end + the tail; the reference stack faster than Tessera's
for impl in tessera reference; do
  "$TESSERA" plan "$big" --nodes 64 --gpus-per-node 8 --json --implementation $impl \
    >"$SCRATCH/time_$impl.json" 2>&1
done
check "llm70b time: tflops_per_gpu = model FLOPs / step / GPUs, mfu = that / peak, step = reductions + tail" \
  "$PYTHON_REF" -c "
import json, sys
t, r = (json.load(open(f)) for f in sys.argv[1:3])
ok = True
for d in (t, r):
    tm, m = d['time'], d['machine']
    tf = d['flops']['model'] / tm['step_s'] / m['world'] / 1e12
    print(f'    {m[\"implementation\"]:9}: step {tm[\"step_s\"]:.3f} s (closed form {tm[\"closed_form_step_s\"]:.3f}), '
          f'{tm[\"tflops_per_gpu\"]:.1f} TFLOP/s per GPU, MFU {tm[\"mfu\"]:.3f}, idle {tm[\"idle_fraction\"]:.4f}')
    ok &= abs(tm['tflops_per_gpu'] - tf) <= 1e-5 * tf and abs(tm['mfu'] - tf / m['peak_tflops']) <= 1e-5
    ok &= abs(tm['step_s'] - tm['reductions_end_s'] - tm['tail_s']) <= 1e-5 * tm['step_s']
    ok &= 0 <= tm['idle_fraction'] < 1 and tm['closed_form_step_s'] > 0 and tm['pipeline_s'] > 0
    ok &= all('sim' in s and 0 <= s['sim']['idle_fraction'] < 1 for s in d['stages'])
ok &= r['time']['step_s'] < t['time']['step_s'] and r['machine']['profile']['tp_overlap'] > 0
sys.exit(0 if ok else 1)" "$SCRATCH/time_tessera.json" "$SCRATCH/time_reference.json"

# ---- 11. profiles: --print-profile read back with --profile gives the same plan; a figure
# changed in the file changes it; bad files and implementations exit 2
"$TESSERA" plan "$big" --nodes 64 --implementation reference --print-profile \
  >"$SCRATCH/ref.nml" 2>&1
"$TESSERA" plan "$big" --nodes 64 --profile "$SCRATCH/ref.nml" --json >"$SCRATCH/ref_file.json" 2>&1
sed 's/^  gemm_efficiency = .*/  gemm_efficiency = 0.35/' "$SCRATCH/ref.nml" >"$SCRATCH/slow.nml"
"$TESSERA" plan "$big" --nodes 64 --profile "$SCRATCH/slow.nml" --json >"$SCRATCH/slow.json" 2>&1
check "a printed profile read back with --profile plans the same step; half the GEMM rate a slower one" \
  "$PYTHON_REF" -c "
import json, sys
a, b, c = (json.load(open(f))['time'] for f in sys.argv[1:4])
print(f'    reference {a[\"step_s\"]:.4f} s, from its printed profile {b[\"step_s\"]:.4f} s, '
      f'with gemm_efficiency halved {c[\"step_s\"]:.4f} s')
sys.exit(0 if abs(a['step_s'] - b['step_s']) <= 1e-4 * a['step_s'] and
         c['step_s'] > 1.4 * a['step_s'] else 1)" "$SCRATCH/time_reference.json" \
  "$SCRATCH/ref_file.json" "$SCRATCH/slow.json"
"$TESSERA" plan "$big" --nodes 64 --profile "$SCRATCH/none.nml" >"$SCRATCH/noprof.txt" 2>&1
rc1=$?
"$TESSERA" plan "$big" --nodes 64 --implementation fast >"$SCRATCH/noimpl.txt" 2>&1
rc2=$?
check "--profile of a missing file and --implementation fast: exit 2, each saying why" \
  test $rc1 -eq 2 -a $rc2 -eq 2 -a -n "$(grep "cannot read the profile" "$SCRATCH/noprof.txt")" \
  -a -n "$(grep "implementation takes tessera or reference" "$SCRATCH/noimpl.txt")"

# ---- 12. --hardware cpu: this host measured at start-up; its profile prints and reads back
"$TESSERA" plan "$tiny" --hardware cpu --json >"$SCRATCH/cpu.json" 2>&1
"$TESSERA" plan "$tiny" --hardware cpu --print-profile >"$SCRATCH/cpu.nml" 2>&1
"$TESSERA" plan "$tiny" --profile "$SCRATCH/cpu.nml" --json >"$SCRATCH/cpu_file.json" 2>&1
check "--hardware cpu: a measured profile of this host (positive rates), read back from its print" \
  "$PYTHON_REF" -c "
import json, re, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
printed = float(re.search(r'peak_fp32_tflops = (\S+)', open(sys.argv[3]).read()).group(1))
m, p = a['machine'], a['machine']['profile']
print(f'    this host: GEMM probe {m[\"peak_fp32_tflops\"] * 1e3:.1f} GFLOP/s, memory {m[\"hbm_gbps\"]:.1f} GB/s, '
      f'gemm_half_dim {p[\"gemm_half_dim\"]:.1f}, kernel {p[\"kernel_us\"]:.2f} us; step {a[\"time\"][\"step_s\"] * 1e3:.2f} ms')
ok = m['hardware'] == 'cpu' and 'this host' in p['source'] and m['peak_fp32_tflops'] > 0
ok &= m['hbm_gbps'] > 0 and p['gemm_efficiency'] > 0 and a['time']['step_s'] > 0
ok &= b['machine']['hardware'] == 'cpu' and b['machine']['peak_fp32_tflops'] == printed
sys.exit(0 if ok else 1)" "$SCRATCH/cpu.json" "$SCRATCH/cpu_file.json" "$SCRATCH/cpu.nml"
# ---- 13. nothing fits: the closest layouts, the shortfall and what closes it; the batch
# warning
"$TESSERA" plan "$big" --nodes 1 --gpus-per-node 8 --search --top 3 parallel.offload=none \
  train.activation_offload=F >"$SCRATCH/short.txt" 2>&1
rc=$?
sed -n '/^search on/,/^nothing fits/p' "$SCRATCH/short.txt" | sed 's/^/    /'
gb=$(sed -n 's/^closest to fitting: .* short by \([0-9.]*\) GB per GPU.*/\1/p' "$SCRATCH/short.txt")
check "llm70b on 1 x 8 H100: exit $rc, the closest layout is short by ${gb:-?} GB per GPU (70-90)" \
  "$PYTHON_REF" -c "import sys; sys.exit(0 if sys.argv[1] == '0' and 70 < float(sys.argv[2] or 0) < 90 else 1)" "$rc" "$gb"
check "  ... its 3 closest layouts are listed, each marked NO with its shortfall" \
  test "$(grep -cE '^ +- .*NO, [0-9.]+ GB short$' "$SCRATCH/short.txt")" -eq 3
check "  ... and what would close it: the offload (held), 4 nodes, or a GPU of about ${gb:+$((${gb%.*} + 80))} GB" \
  sh -c "grep -q '^  more nodes (--nodes) *4 nodes, the fewest where a layout fits' '$SCRATCH/short.txt' &&
    grep -q \"^  parallel.offload = 'optimizer' (held by the command line) *[0-9.]* GB: fits\" '$SCRATCH/short.txt' &&
    grep -q '^  a GPU with more memory (--hardware) *15[0-9.]* GB per GPU' '$SCRATCH/short.txt'"
"$TESSERA" plan "$big" --nodes 1 --gpus-per-node 8 --search --json parallel.offload=none \
  train.activation_offload=F >"$SCRATCH/short.json" 2>&1
check "  ... the JSON gives the same shortfall" "$PYTHON_REF" -c "
import json, sys
c = json.load(open(sys.argv[1]))['search']['closest']
sys.exit(0 if abs(c['short_gb'] - float(sys.argv[2])) < 0.01 and not c['layout']['fits'] else 1)" \
  "$SCRATCH/short.json" "${gb:-0}"
"$TESSERA" plan "$tiny" --search --json "${HW[@]}" hardware.hbm_gb=0.045 model.n_layer=6 \
  train.recompute=none train.micro_batch=4 train.activation_offload=F >"$SCRATCH/held.json" 2>&1
check "tiny with recompute none and micro_batch 4 held on 45 MB: recompute 'full' or micro_batch 1 closes it" \
  "$PYTHON_REF" -c "
import json, sys
c = json.load(open(sys.argv[1]))['search']['closest']
k = {x['key']: x for x in c['keys']}
print('    short by', c['short_gb'], 'GB:', [(x['key'], x['value'], x['fits']) for x in c['keys']])
sys.exit(0 if c['short_gb'] > 0 and k['train.recompute']['fits'] and k['train.recompute']['held']
         and k['train.micro_batch']['fits'] else 1)" "$SCRATCH/held.json"
"$TESSERA" plan "$big" --nodes 64 model.seq_len=131072 >"$SCRATCH/long.txt" 2>&1
head -n 1 "$SCRATCH/long.txt" | fold -w 100 | sed 's/^/    /'
check "a 131072-token deck: the planner warns, 1024 x 131072 = 134217728 tokens, 128 or less in range" \
  grep -q '^warning: train.global_batch = 1024 x model.seq_len = 131072 = 134217728 tokens per step (134.2 M), far above.*train.global_batch = 128 or less' \
  "$SCRATCH/long.txt"
timeout 120 "$TESSERA" "$tiny" "${T[@]}" run.max_steps=0 train.global_batch=262144 \
  run.out_dir="$SCRATCH/bigbatch" >"$SCRATCH/bigbatch.log" 2>&1
check "  ... and so does the trainer at its start (262144 x 128 = 33554432 tokens)" \
  grep -q '^warning: train.global_batch = 262144 x model.seq_len = 128 = 33554432 tokens per step' \
  "$SCRATCH/bigbatch.log"
finish
