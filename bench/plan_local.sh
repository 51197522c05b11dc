#!/usr/bin/env bash
# bench/plan_local.sh — the planner against this machine: `tessera plan --hardware cpu`
# (the kernel rates measured when it starts, the link between two ranks measured under
# mpirun -np 2) predicts the CPU runs of bench/pp.sh and bench/tp.sh on 2 ranks, which then
# run; prints predicted against measured step time and pipeline idle fraction.
#
#   bench/plan_local.sh [TESSERA] [STEPS]     (default src/tessera, 30 steps; about 8 min)
#   REPEAT=N  trains each case N times (default 3) and reports the medians over the runs:
#             one run of a case can land 10-20% off its neighbours on this VM (a GPipe
#             row did, at m 8 in one run and m 16 in another), the plan is made once
#
# Runs (the models of bench/pp.sh and bench/tp.sh, fp32, one thread per rank):
#   pp 2: llama, 8 layers, d_model 128, 4 heads, 2 KV heads, d_ff 352, byte vocabulary,
#         seq 64, micro_batch 1, m = 4, 8, 16 micro-batches, schedules gpipe, 1f1b,
#         interleaved (2 chunks per stage), zb_h1 and zb_v (2 chunks per stage, in a V);
#   tp 2: the same widths with 4 KV heads, micro_batch 2, one micro-batch, 2 and 4 layers.
# Columns:
#   meas ms   median of metrics.jsonl "step_ms" over the steps after the first two (the
#             median of the REPEAT runs' medians)
#   plan ms   time.step_s of `mpirun -np 2 tessera plan ... --hardware cpu --json`, run
#             just before the training run with the same overrides
#   ratio     plan / measured (the issue asks 0.8-1.2)
#   meas idle median over steps of the mean over stages of the trainer's measured bubble
#             (a stage's waits over its own time in the schedule)
#   plan idle time.idle_fraction: the same quantity in the planner's replay
#   diff      plan - measured idle, in points (the issue asks within 3)
#   ms of each run   each run's median step time, the spread behind "meas ms"
# The whole script holds `flock /tmp/bench.lock`, so that no other benchmark runs between
# a plan and its run; other work on the machine still can (the load average is printed
# before and after: compare rows only when it stayed low).  Times are never checked: the
# script exits 1 only when a run fails.
set -euo pipefail
if [ -z "${PLAN_LOCAL_LOCKED:-}" ]; then
  exec env PLAN_LOCAL_LOCKED=1 flock /tmp/bench.lock "$0" "$@"
fi
TESSERA=${1:-src/tessera}
STEPS=${2:-30}
REPEAT=${REPEAT:-3}
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
MODEL=(model.arch=llama model.vocab_size=256 model.d_model=128 model.n_head=4 model.d_ff=352
  model.seq_len=64 model.tie_embeddings=.false. train.recompute=none train.precision=fp32)
RUN=(run.max_steps="$STEPS" run.log_every=1 run.eval_every=0 "data.train=$W/data/train_*.bin"
  checkpoint.resume=none checkpoint.every_steps=0)

case_row() { # case_row NAME overrides...: plan, train, print the row
  local name=$1 out="$W/$1"
  shift
  if ! mpirun -np 2 "$TESSERA" plan /dev/null "${MODEL[@]}" "$@" --hardware cpu \
      --gpus-per-node 2 --json >"$out.json" 2>"$out.plan.err"; then
    echo "bench/plan_local.sh: tessera plan for $name failed:" >&2
    cat "$out.plan.err" >&2
    exit 1
  fi
  local r
  for r in $(seq "$REPEAT"); do
    if ! timeout 600 mpirun -np 2 "$TESSERA" /dev/null "${MODEL[@]}" "$@" "${RUN[@]}" \
        run.out_dir="$out.$r" >"$out.$r.log" 2>&1; then
      echo "bench/plan_local.sh: the run $name failed; its log ends:" >&2
      tail -n 20 "$out.$r.log" >&2
      exit 1
    fi
  done
  /usr/bin/python3 - "$out" "$name" "$REPEAT" <<'PY'
import json, re, statistics, sys
out, name, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
def one(run):  # a run's median step time and median mean-over-stages bubble
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"loss"' in l]
    means, step = [], 0
    for line in open(run + ".log"):
        s = re.match(r"step\s+(\d+)/", line)
        if s:
            step = int(s.group(1))
        b = re.match(r"pipeline bubble \(measured idle / step time, stages 0\.\.\d+\):([0-9. ]+)\|",
                     line)
        if b and step > 2:
            vals = [float(x) for x in b.group(1).split()]
            means.append(sum(vals) / len(vals))
    return statistics.median(r["step_ms"] for r in rows[2:]), statistics.median(means) if means else 0.0
runs = [one(f"{out}.{r}") for r in range(1, repeat + 1)]
meas = statistics.median(t for t, _ in runs)
mi = statistics.median(i for _, i in runs)
plan = json.load(open(out + ".json"))["time"]
pi = plan["idle_fraction"]
print(f"{name:<22} {meas:8.2f} {plan['step_s'] * 1e3:8.2f} {plan['step_s'] * 1e3 / meas:6.2f} "
      f"{mi:9.3f} {pi:9.3f} {100 * (pi - mi):+6.1f}   {' '.join(f'{t:.2f}' for t, _ in runs)}",
      flush=True)
with open(out + ".row", "w") as f:
    f.write(f"{plan['step_s'] * 1e3 / meas} {100 * (pi - mi)}\n")
PY
}

echo "load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg) (on $(getconf _NPROCESSORS_ONLN) cores)"
printf "%-22s %8s %8s %6s %9s %9s %6s   %s\n" run "meas ms" "plan ms" ratio "meas idle" "plan idle" \
  diff "ms of each run"
for m in 4 8 16; do
  for sv in "gpipe 1" "1f1b 1" "interleaved 2" "zb_h1 1" "zb_v 2"; do
    set -- $sv
    case_row "pp2_${1}_m$m" model.n_layer=8 model.n_kv_head=2 train.micro_batch=1 \
      train.global_batch=$m parallel.pp=2 parallel.schedule="$1" parallel.virtual_stages="$2"
  done
done
for nl in 2 4; do
  case_row "tp2_layers$nl" model.n_layer=$nl model.n_kv_head=4 train.micro_batch=2 \
    train.global_batch=2 parallel.tp=2
done
echo "load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "$W"/*.row | /usr/bin/python3 -c "
import sys
r = [tuple(map(float, l.split())) for l in sys.stdin]
print(f'step time plan / measured: {min(x for x, _ in r):.2f} .. {max(x for x, _ in r):.2f} '
      f'({sum(abs(x - 1) <= 0.2 for x, _ in r)} of {len(r)} within 20%); idle: plan - measured '
      f'{min(d for _, d in r):+.1f} .. {max(d for _, d in r):+.1f} points '
      f'({sum(abs(d) <= 3 for _, d in r)} of {len(r)} within 3)')"
