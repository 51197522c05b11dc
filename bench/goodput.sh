#!/usr/bin/env bash
# bench/goodput.sh — goodput under failures on the local Slurm cluster: a job trains to
# STEPS while a fault injector kill -9s one of its ranks (a random rank of a random node)
# at exponentially distributed intervals of mean MTBF seconds (a Poisson process of
# failures); the job requeues itself as jobs/smoke.slurm does in production and resumes
# from its newest complete checkpoint, until it completes.
#
#   bench/goodput.sh [MTBF_S] [STEPS] [CONFIGS]
#     MTBF_S   mean seconds between injected failures (default 60)
#     STEPS    steps of each run (default 600)
#     CONFIGS  which runs, space-separated (default "sync:20 async:20 sync:auto async:auto"):
#              MODE:EVERY with MODE sync or async (checkpoint.async) and EVERY a fixed
#              checkpoint.every_steps or 'auto' (Young-Daly, checkpoint.mtbf_hours = MTBF)
#   MODEL='model.d_model=256 ...' adds model overrides (default: the tiny deck, 4 ranks =
#   tp 2 x dp 2 on 2 nodes, as jobs/smoke.slurm runs it).
#   SEED (default 1) seeds the failure process: every config meets the same sequence of
#   intervals between kills and the same choice of victims (common random numbers).
#
# First an uninterrupted run of the same job gives the step time t_step (median of
# metrics.jsonl "step_ms" over its steps) and the reference losses.  For every config:
#   wall       seconds from sbatch to COMPLETED (every attempt, requeue waits included)
#   kills      failures injected;  attempts  the job's starts (Slurm's Restarts + 1)
#   goodput    retained step time / wall = STEPS x t_step / wall
#   C          median time training was blocked per checkpoint (metrics "checkpoint"
#              events: blocked_s, else the synchronous write time)
#   T          the checkpoint interval in seconds (every_steps x t_step; for 'auto' the
#              median of the intervals the run logged, "checkpoint: 'auto' interval N
#              steps", over all its attempts)
#   R          restart cost: median seconds from a kill to the first step of the next
#              attempt
#   s          the run's median step time over the uninterrupted run's: what a
#              background writer costs the steps it shares the cores with (1 for sync)
#   W_s        median seconds a checkpoint takes to become complete (the write itself;
#              for async the background write, which a failure in flight loses)
#   predicted  the first-order Young-Daly goodput, each period of T s of steps costing
#              T s + C of wall time and each failure the restart R, half a period and,
#              for async, the write in flight W:
#                (T / (T s + C)) (1 - (R + (T s + C)/2 + W_async) / MTBF)
#              (for sync, s = 1 and W_async = 0: (T/(T+C))(1 - (R + (T+C)/2)/MTBF))
#   bitwise    the final losses of every step equal the uninterrupted run's to the bit
# A requeued job is started as soon as its last attempt has cleaned up (tests/
# slurm_cluster.sh, tsr_slurm_wait) — Slurm itself would wait two minutes — so R is the
# trainer's restart (MPI start-up, resume) plus a few seconds of the cluster's.
# Times are never checked; exit 1 only when the cluster or a run fails.
set -uo pipefail
MTBF=${1:-60}
STEPS=${2:-600}
CONFIGS=${3:-"sync:20 async:20 sync:auto async:auto"}
SEED=${SEED:-1}
TESSERA=${TESSERA:-src/tessera}
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
TESSERA=$(cd "$(dirname "$TESSERA")" && pwd)/$(basename "$TESSERA")
# shellcheck source=tests/e2e/slurm_cluster.sh
. "$here/tests/e2e/slurm_cluster.sh"
tsr_slurm_have || { echo "bench/goodput.sh: Slurm and munge are not installed" >&2; exit 1; }
export TESSERA
tsr_slurm_start 2 4 || exit 1

COMMON="optim.warmup_steps=5 optim.decay_steps=$STEPS run.log_every=1 run.eval_every=0 ${MODEL:-}"
# submit NAME EXTRA: jobs/smoke.slurm into $W/NAME with unbounded restarts; sets JOB
submit() {
  JOB=$(cd "$here" && OUT_DIR="$W/$1" DATA_DIR="$W/data" MAX_STEPS=$STEPS MAX_RESTARTS=100000 \
    EXTRA_ARGS="$COMMON $2" sbatch --parsable -o "$W/$1.out" jobs/smoke.slurm)
  JOB=${JOB%%;*}
}
# running_ranks JOB: PIDs of the job's tessera processes (the fake nodes are this host)
running_ranks() {
  local p
  for p in $(pgrep -x tessera); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_JOB_ID=$1" && echo "$p"
  done
}
# inject JOB LOG: kill -9 a random rank after Exp(MTBF) seconds, again and again, while
# the job is not finished; one line per kill (epoch seconds, pid) in LOG
inject() {
  local job=$1 log=$2 wait pids n waits victim
  # the same failure times and victims for every config (SEED): common random numbers,
  # so that the configs are compared on one draw of the failure process, not four
  read -r -a waits < <(/usr/bin/python3 -c "import random; r = random.Random($SEED)
print(' '.join(f'{r.expovariate(1 / $MTBF):.2f}' for _ in range(100000)))")
  RANDOM=$SEED
  for wait in "${waits[@]}"; do
    sleep "$wait"
    case $(tsr_slurm_field "$job" JobState) in
      COMPLETED | FAILED | CANCELLED | TIMEOUT) return ;;
    esac
    mapfile -t pids < <(running_ranks "$job")
    n=${#pids[@]}
    [ "$n" -gt 0 ] || continue # between attempts: this failure finds nothing to kill
    victim=${pids[RANDOM % n]}
    kill -KILL "$victim" 2>/dev/null && echo "$(date +%s.%N) $victim" >>"$log"
  done
}

echo "goodput on the local Slurm cluster: $STEPS steps, failures every ${MTBF} s on average (seed $SEED)"
echo "load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg) (on $(getconf _NPROCESSORS_ONLN) cores)"
submit clean "checkpoint.every_steps=0"
tsr_slurm_wait "$JOB" 3600 || exit 1
[ "$(tsr_slurm_field "$JOB" JobState)" = COMPLETED ] || { tail -n 20 "$W/clean.out"; exit 1; }

printf "%-12s %7s %5s %8s %8s %7s %7s %7s %6s %5s %6s %9s %s\n" config wall_s kills attempts \
  goodput C_s T_s R_s every s W_s predicted bitwise
for cfg in $CONFIGS; do
  mode=${cfg%%:*} every=${cfg#*:}
  extra="checkpoint.async=$([ "$mode" = async ] && echo .true. || echo .false.)"
  if [ "$every" = auto ]; then
    extra="$extra checkpoint.every_steps=auto checkpoint.mtbf_hours=$(/usr/bin/python3 -c "print($MTBF / 3600)")"
  else
    extra="$extra checkpoint.every_steps=$every"
  fi
  name=${mode}_$every
  t0=$(date +%s.%N)
  submit "$name" "$extra"
  : >"$W/$name.kills"
  inject "$JOB" "$W/$name.kills" &
  injector=$!
  tsr_slurm_wait "$JOB" 7200
  t1=$(date +%s.%N)
  kill "$injector" 2>/dev/null
  wait "$injector" 2>/dev/null
  state=$(tsr_slurm_field "$JOB" JobState)
  restarts=$(tsr_slurm_field "$JOB" Restarts)
  [ "$state" = COMPLETED ] || { echo "$name: job $JOB ended $state" >&2; tail -n 20 "$W/$name.out" >&2; exit 1; }
  /usr/bin/python3 - "$W" "$name" "$t0" "$t1" "$restarts" "$MTBF" "$STEPS" "$every" <<'PY'
import datetime, json, re, statistics, sys
W, name, t0, t1, restarts, mtbf, steps, every = sys.argv[1:]
t0, t1, mtbf, steps = float(t0), float(t1), float(mtbf), int(steps)
def lines(run):
    out = []
    for l in open(f"{W}/{run}/metrics.jsonl"):
        try:
            out.append(json.loads(l))
        except ValueError:
            pass  # a line cut by a kill
    return out
clean = lines("clean")
t_step = statistics.median(d["step_ms"] for d in clean if "loss" in d) / 1e3
ref = {d["step"]: d["loss"] for d in clean if "loss" in d}
run = lines(name)
last = {}
for d in run:
    if "loss" in d:
        last[d["step"]] = d["loss"]
bitwise = all(last.get(s) == ref.get(s) for s in range(1, steps + 1))
ck = [d for d in run if d.get("event") == "checkpoint"]
def blocked_of(d):  # the async fields when present, else the write time in "detail"
    for k in ("blocked_s", "write_s"):
        if isinstance(d.get(k), (int, float)):
            return d[k]
    try:
        return float(str(d.get("detail", "")).split()[0])
    except (IndexError, ValueError):
        return None
blocked = [b for b in map(blocked_of, ck) if b is not None]
C = statistics.median(blocked) if blocked else float("nan")
if every == "auto":  # the median of the intervals the run logged (its job output)
    ivals = re.findall(r"checkpoint: 'auto' interval (\d+) steps", open(f"{W}/{name}.out").read())
    steps_per = statistics.median(map(int, ivals)) if ivals else float("nan")
else:
    steps_per = int(every)
T = steps_per * t_step
# restart cost: from each kill to the first loss line written after it
kills = [float(l.split()[0]) for l in open(f"{W}/{name}.kills") if l.strip()]
def epoch(d):
    return datetime.datetime.strptime(d["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()
first_steps = []
for k in kills:
    after = [epoch(d) for d in run if "loss" in d and epoch(d) > k]
    if after:
        first_steps.append(min(after) - k)
R = statistics.median(first_steps) if first_steps else float("nan")
wall = t1 - t0
good = steps * t_step / wall
slow = statistics.median(d["step_ms"] for d in run if "loss" in d) / 1e3 / t_step
writes = [d["write_s"] for d in ck if isinstance(d.get("write_s"), (int, float))]
Wr = statistics.median(writes) if writes else C
asyn = any(d.get("async") is True for d in ck)
period = T * slow + C
pred = (T / period) * (1 - (R + period / 2 + (Wr if asyn else 0)) / mtbf) if T == T and T > 0 \
    else float("nan")
print(f"{name:<12} {wall:7.1f} {len(kills):5d} {int(restarts) + 1:8d} {good:8.3f} {C:7.3f} "
      f"{T:7.2f} {R:7.2f} {str(steps_per):>6} {slow:5.2f} {Wr:6.2f} {pred:9.3f} "
      f"{'yes' if bitwise else 'NO'}")
PY
done
echo "t_step from the uninterrupted run; goodput = $STEPS x t_step / wall"
