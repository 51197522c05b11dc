#!/usr/bin/env bash
# bench/pp.sh — pipeline schedules on this machine's CPU ranks: ms/step, tokens/s and the
# measured bubble for pp = 2, 4 under gpipe, 1f1b, interleaved (2 virtual stages), zb_h1 and
# zb_v (2 chunks per stage in a V) at m = 4, 8, 16 micro-batches per step, against pp 1 at
# the same m.
#
#   bench/pp.sh [TESSERA] [STEPS]      (default src/tessera, 30 steps; about 2 min here)
#
# Model: llama, 8 layers, d_model 128, 4 heads, 2 KV heads, d_ff 352, byte vocabulary,
# seq 64, micro_batch 1, fp32, no recompute; dp = tp = 1, so global_batch = m.  pp 1 runs
# the same m micro-batches as gradient accumulation on one rank ("vs pp1" divides by it).
# Interleaved needs m % pp == 0 and n_layer % (pp v) == 0; rows that fail it are skipped.
#
# Columns, each over the steps after the first two (warm-up):
#   ms/step   median of metrics.jsonl "step_ms" (the whole step: schedule + optimizer)
#   tok/s     tokens per step / median step time; "vs pp1" its ratio to pp 1 at that m
#   bub mean  median over steps of the mean over stages of the trainer's measured bubble,
#             a stage's time in waits (receives, send completions, slot reuse) divided by
#             its time in the schedule (the optimizer is outside both)
#   bub max   median over steps of the largest stage's bubble
#   theory    the trainer's (p-1)/(m+p-1), interleaved (p-1)/(v m+p-1), zb_h1 (p-1)/(3m+p-1)
#             for m >= p, zb_v (p-1)/(6m+p-1) for m >= 2p-1 (equal F, B, W;
#             src/sched/pipeline.c derives them): free transfers, equal stages, as a fraction of
#             the step
#   slots/MB  stage 0's activation slots and their size, from the "pipeline:" line
#
# Reading the measured bubble on this machine:
# - It has 2 cores.  pp 2 runs one rank per core; pp 4 runs 4 single-threaded ranks on 2
#   cores (oversubscribed), so a stage's "idle" time there also holds the time it waits
#   for a core while another stage computes — not only the pipeline bubble.  Expect the
#   pp 4 bubble far above the theory and pp 4 no faster than pp 2.
# - The micro-batches are tiny (1 x 64 tokens).  One micro-batch through the whole 8-layer
#   model, forward and backward, takes roughly 10-15 ms on one core here, so a pp 4 stage's
#   forward is about 1 ms and an interleaved chunk's (one layer) well under that.  Handing
#   a 32 kB activation or gradient to the next stage — MPI latency, plus waking the
#   receiving rank, which on a shared 2-core machine can mean waiting for a time slice —
#   costs from tens of microseconds to about a millisecond, i.e. comparable to the compute
#   it hands over, and every micro-batch pays it, so it does not fall with m.  That shows
#   where the theory's fill/drain term gets small: at pp 2 and m 16 the three schedules
#   measure about the same bubble, so interleaving, which adds hand-overs (v chunks), gets
#   far less than the halving its theory promises; under load (waits for a time slice)
#   the measured bubble is above the theory for every schedule.
# - The script prints the load average before it starts: other processes on the machine
#   take cores from the ranks, and that time also counts as idle.
# Times are never checked; the script exits 1 only when a run fails (printing its log tail).
set -euo pipefail
TESSERA=${1:-src/tessera}
STEPS=${2:-30}
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N_LAYER=8

run() { # pp schedule v m -> $W/<name>.log and $W/<name>/metrics.jsonl
  local pp=$1 sc=$2 v=$3 m=$4 out="$W/p$1$2v$3m$4"
  if ! timeout 600 mpirun -np "$pp" "$TESSERA" /dev/null model.arch=llama model.vocab_size=256 \
      model.n_layer=$N_LAYER model.d_model=128 model.n_head=4 model.n_kv_head=2 model.d_ff=352 \
      model.seq_len=64 model.tie_embeddings=.false. train.micro_batch=1 train.global_batch="$m" \
      train.recompute=none parallel.pp="$pp" parallel.schedule="$sc" parallel.virtual_stages="$v" \
      run.max_steps="$STEPS" run.log_every=1 run.eval_every=0 "data.train=$W/data/train_*.bin" \
      checkpoint.resume=none checkpoint.every_steps=0 run.out_dir="$out" >"$out.log" 2>&1; then
    echo "bench/pp.sh: pp $pp schedule $sc v $v m $m failed; its log ends:" >&2
    tail -n 20 "$out.log" >&2
    exit 1
  fi
}

row() { # pp schedule v m: print the row (pp 1 also records the reference for its m)
  /usr/bin/python3 - "$W" "$@" <<'PY'
import json, re, statistics, sys
W, pp, sc, v, m = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
name = f"{W}/p{pp}{sc}v{v}m{m}"
rows = [json.loads(l) for l in open(name + "/metrics.jsonl") if '"loss"' in l]
ms = statistics.median(r["step_ms"] for r in rows[2:])
tps = rows[0]["tokens"] / rows[0]["step"] / (ms / 1e3)
if pp == 1:
    open(f"{W}/ref{m}", "w").write(f"{tps}")
ref = float(open(f"{W}/ref{m}").read())
step, means, maxes, theory, slots, mb = 0, [], [], "-", "-", "-"
for line in open(name + ".log"):
    s = re.match(r"step\s+(\d+)/", line)
    if s:
        step = int(s.group(1))
    b = re.match(r"pipeline bubble \(measured idle / step time, stages 0\.\.\d+\):([0-9. ]+)\| theory \S+ ([0-9.]+)", line)
    if b:
        theory = b.group(2)
        if step > 2:
            vals = [float(x) for x in b.group(1).split()]
            means.append(sum(vals) / len(vals))
            maxes.append(max(vals))
    k = re.search(r"stage 0 keeps (\d+) activation slot\(s\): ([0-9.]+) MB", line)
    if k:
        slots, mb = k.group(1), k.group(2)
mean = f"{statistics.median(means):8.3f}" if means else "       -"
mx = f"{statistics.median(maxes):8.3f}" if maxes else "       -"
label = "-" if pp == 1 else sc
print(f"{pp:<3} {label:<12} {v:<2} {m:<3} {ms:8.2f} {tps:8.0f} {tps / ref:7.2f} {mean} {mx} "
      f"{theory:>7} {slots:>6} {mb:>7}")
PY
}

echo "load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg) (on $(getconf _NPROCESSORS_ONLN) cores)"
printf "%-3s %-12s %-2s %-3s %8s %8s %7s %8s %8s %7s %6s %7s\n" pp schedule v m ms/step tok/s \
  "vs pp1" "bub mean" "bub max" theory slots MB
for m in 4 8 16; do
  run 1 1f1b 1 $m
  row 1 1f1b 1 $m
  for pp in 2 4; do
    for sv in "gpipe 1" "1f1b 1" "interleaved 2" "zb_h1 1" "zb_v 2"; do
      set -- $sv
      if [ "$1" = interleaved ] && { [ $((m % pp)) != 0 ] || [ $((N_LAYER % (pp * $2))) != 0 ]; }; then
        continue
      fi
      run $pp "$1" "$2" $m
      row $pp "$1" "$2" $m
    done
  done
done
