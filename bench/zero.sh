#!/usr/bin/env bash
# bench/zero.sh — data-parallel throughput and traffic: tokens/s and ms/step for
# dp = 1, 2, 4 at zero stage 0..3, on this machine's CPU ranks, and the bytes each rank
# moves per step (ring-algorithm count, from the trainer's per-group counters) against
# the theoretical minimum for the stage.  Reference: dp 1 / zero 0 in the same run.
#
#   bench/zero.sh [TESSERA] [STEPS]      (default src/tessera, 20 steps)
#
# The model is a 4-layer llama, d_model 128, byte vocabulary, 128-token sequences, one
# micro-batch of 4 sequences per rank per step (so k = 1: the reduce-once minimum applies
# to stages 0-2).  Minimum per rank per step, B = 4 bytes x flat length, N = dp:
#   zero 0  all-reduce                      2 (N-1)/N B
#   zero 1  reduce-scatter + all-gather     2 (N-1)/N B
#   zero 2  same as zero 1 (k = 1)          2 (N-1)/N B
#   zero 3  + a second gather for backward  3 (N-1)/N B - (N-1)/N 4 |embedding unit|
# A ratio of 1.00 means no byte is moved twice.  ms/step is the median over the steps
# after the first two.  Oversubscription: this machine has 2 cores, so dp 4 runs 4
# single-threaded ranks on 2 cores and cannot be faster than dp 2.
set -euo pipefail
TESSERA=${1:-src/tessera}
STEPS=${2:-20}
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
printf "%-4s %-5s %10s %10s %8s %14s %14s %6s\n" dp zero "tok/s" "ms/step" "vs ref" "bytes/step" "minimum" ratio
ref=
for dp in 1 2 4; do
  for st in 0 1 2 3; do
    [ $dp = 1 ] && [ $st != 0 ] && continue
    out="$W/d${dp}z$st"
    mpirun -np $dp "$TESSERA" /dev/null model.vocab_size=256 model.n_layer=4 model.d_model=128 \
      model.n_head=4 model.n_kv_head=2 model.d_ff=352 model.seq_len=128 train.micro_batch=4 \
      train.global_batch=$((4 * dp)) run.max_steps=$STEPS run.log_every=1 run.eval_every=0 \
      "data.train=$W/data/train_*.bin" checkpoint.resume=none checkpoint.every_steps=0 \
      parallel.zero_stage=$st run.out_dir="$out" >"$out.log" 2>&1
    /usr/bin/python3 - "$out" $dp $st "${ref:-0}" <<'PY'
import json, re, statistics, sys
out, dp, st, ref = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rows = [json.loads(l) for l in open(out + "/metrics.jsonl") if '"loss"' in l]
ms = statistics.median(r["step_ms"] for r in rows[2:])
tok = rows[0]["tokens"] / rows[0]["step"] if rows else 0
tps = tok / (ms / 1e3)
log = open(out + ".log").read()
m = re.search(r"comm per step \(rank 0, ring-algorithm bytes\): (.*)", log)
moved = 0.0
if m:  # sum every group's MB except scalars
    for grp in m.group(1).split("; "):
        for kind, mb in re.findall(r"(\w+) ([0-9.]+)", grp.split("(", 1)[1]):
            if kind != "scalar":
                moved += float(mb) * 1e6
flat = int(re.search(r"shard of \d+ of (\d+) elements", log).group(1))
emb = 256 * 128  # the embedding unit (embed.weight)
B, N = 4.0 * flat, dp
minimum = 0.0 if N == 1 else (3 * (N - 1) / N * B - (N - 1) / N * 4 * emb if st == 3 else 2 * (N - 1) / N * B)
ratio = f"{moved / minimum:6.2f}" if minimum else "     -"
vs = f"{tps / ref:8.2f}" if ref else "    1.00"
print(f"{dp:<4} {st:<5} {tps:10.0f} {ms:10.2f} {vs} {moved:14.0f} {minimum:14.0f} {ratio}")
with open(out + ".tps", "w") as f:
    f.write(f"{tps}")
PY
    if [ -z "$ref" ]; then ref=$(cat "$out.tps"); fi
  done
done
