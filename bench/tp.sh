#!/usr/bin/env bash
# bench/tp.sh — tensor-parallel traffic per transformer layer against the Megatron count,
# and throughput, for tp = 1, 2, 4 (and dp 2 x tp 2) on this machine's CPU ranks.
#
#   bench/tp.sh [TESSERA] [STEPS]      (default src/tessera, 100 steps; about 20 s here)
#
# Model: llama, d_model 128, 4 heads (head_dim 32), d_ff 352, byte vocabulary, seq 64,
# micro_batch 2 per rank, one micro-batch per step, fp32, no activation recompute.  Each
# layout runs twice, with n_layer 2 and n_layer 4; the tp all-reduce bytes of the two runs
# (rank 0's ring-algorithm count from the trainer's first-step "comm per step" line) differ
# by exactly two layers, so
#   per layer  = (bytes(n_layer 4) - bytes(n_layer 2)) / 2
#   per step   = bytes(n_layer 2) - 2 per layer   (embedding all-reduce in forward and the
#                LM head's input-gradient all-reduce in backward; the cross-entropy
#                statistics are doubles and counted apart, as "scalar")
# Megatron, a layer without sequence parallelism: two all-reduces of the [b s, h]
# activation in forward (after attention's and the MLP's row-parallel GEMM) and two in
# backward (the column-parallel GEMMs' input gradients), each 2 (T-1)/T b s h 4 bytes:
#   Megatron per layer = 4 * 2 (T-1)/T * b s h * 4        (T = tp, h = d_model)
# With n_kv_head < tp the KV heads are replicated and their weight gradients are summed
# over tp once per layer, an all-reduce of n_kv_head * 2 * head_dim * d_model floats:
#   KV extra per layer = 2 (T-1)/T * 4 * n_kv_head * 2 head_dim * d_model
# "expect" is (Megatron + KV extra) / Megatron; "ratio" is measured / Megatron.  The log
# prints MB to three decimals, so a per-layer figure is good to about +-500 bytes.
#
# ms/step is the median over the steps after the first two of the n_layer 4 run; tok/s
# is its tokens per step over that; "vs tp1" divides by dp 1 / tp 1 of the same run.
# Oversubscription: this machine has 2 cores, so tp 4 (and dp 2 x tp 2) runs 4
# single-threaded ranks on 2 cores; those rows cannot be faster than two ranks.  The
# byte columns do not depend on this.
set -euo pipefail
TESSERA=${1:-src/tessera}
STEPS=${2:-100}
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

run() { # dp tp n_kv_head n_layer -> $W/<name>.log and $W/<name>/metrics.jsonl
  local dp=$1 tp=$2 kv=$3 nl=$4 out="$W/d$1t$2k$3l$4"
  if ! mpirun -np $((dp * tp)) "$TESSERA" /dev/null model.arch=llama model.vocab_size=256 \
      model.n_layer=$nl model.d_model=128 model.n_head=4 model.n_kv_head=$kv model.d_ff=352 \
      model.seq_len=64 train.micro_batch=2 train.global_batch=$((2 * dp)) train.recompute=none \
      parallel.tp=$tp run.max_steps=$STEPS run.log_every=1 run.eval_every=0 \
      "data.train=$W/data/train_*.bin" checkpoint.resume=none checkpoint.every_steps=0 \
      run.out_dir="$out" >"$out.log" 2>&1; then
    echo "bench/tp.sh: dp $dp tp $tp n_kv_head $kv n_layer $nl failed; its log ends:" >&2
    tail -n 20 "$out.log" >&2
    exit 1
  fi
}

printf "%-3s %-3s %-3s %10s %10s %9s %9s %6s %9s %6s %9s %8s %8s %7s\n" dp tp kv "AR L2" "AR L4" \
  "per layer" Megatron ratio "KV extra" expect "per step" "ms/step" "tok/s" "vs tp1"
echo 0 >"$W/ref"
for case in "1 1 4" "1 2 4" "1 4 4" "2 2 4" "1 4 2"; do
  set -- $case
  run "$@" 2
  run "$@" 4
  /usr/bin/python3 - "$W" "$@" <<'PY'
import json, re, statistics, sys
W, dp, tp, kv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
b, s, h, n_head = 2, 64, 128, 4
head_dim = h // n_head

def tp_all_reduce(nl):
    """rank 0's tp all-reduce bytes in the first step, 0 when there is no tp group"""
    log = open(f"{W}/d{dp}t{tp}k{kv}l{nl}.log").read()
    m = re.search(r"comm per step \(rank 0, ring-algorithm bytes\): (.*)", log)
    if not m:
        return 0.0
    for grp in m.group(1).split("; "):
        if grp.split(" ", 1)[0] == "tp":
            a = re.search(r"all_reduce ([0-9.]+)", grp)
            return float(a.group(1)) * 1e6 if a else 0.0
    return 0.0

a2, a4 = tp_all_reduce(2), tp_all_reduce(4)
per_layer = (a4 - a2) / 2
per_step = a2 - 2 * per_layer
ring = 2 * (tp - 1) / tp
megatron = 4 * ring * b * s * h * 4
kv_extra = ring * 4 * kv * 2 * head_dim * h if kv < tp else 0.0
ratio = f"{per_layer / megatron:6.2f}" if megatron else "     -"
expect = f"{(megatron + kv_extra) / megatron:6.2f}" if megatron else "     -"

rows = [json.loads(l) for l in open(f"{W}/d{dp}t{tp}k{kv}l4/metrics.jsonl") if '"loss"' in l]
ms = statistics.median(r["step_ms"] for r in rows[2:])
tps = rows[0]["tokens"] / rows[0]["step"] / (ms / 1e3)
ref = float(open(f"{W}/ref").read()) or tps
if tp == 1 and dp == 1:
    open(f"{W}/ref", "w").write(f"{tps}")
print(f"{dp:<3} {tp:<3} {kv:<3} {a2:10.0f} {a4:10.0f} {per_layer:9.0f} {megatron:9.0f} {ratio} "
      f"{kv_extra:9.0f} {expect} {per_step:9.0f} {ms:8.2f} {tps:8.0f} {tps / ref:7.2f}")
PY
done
