#!/usr/bin/env bash
# ckpt_kill.sh — kill -9 during background checkpoint writes (checkpoint.async), TRIALS times.
# The tiny llama of tests/e2e/ckpt_async.sh on NP ranks (dp, ZeRO 1), 12 steps, a checkpoint
# every 3 steps.  One uninterrupted run is the reference.  Each trial draws the checkpoint
# whose write is hit (step 3, 6 or 9), where the write pauses (TSR_FAULT ckpt_sleep=2 with
# ckpt_where 'start': before the file is created, or 'half': half-way, the .tmp open), the
# rank to kill and when (0 to 1.7 s into the pause; training goes on meanwhile), then:
#   - the job fails, no file of the hit step exists, and `latest` names the checkpoint
#     before it (none when the hit one was step 3);
#   - the next start (checkpoint.resume = 'auto') resumes from that checkpoint (from the
#     seed when there is none) and runs to step 12;
#   - every step's loss and gradient norm (the last line of each step) and the step-12
#     checkpoint (/model, /optim, step, tokens, data_cursor) equal the reference's bitwise.
# Prints one line per trial and the count; exits 1 when a trial fails.  Never fails on time.
# Usage: bench/ckpt_kill.sh [TRIALS] [NP] [SEED]   (top_builddir / top_srcdir as for the tests)
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
TRIALS=${1:-20}
NP=${2:-2}
SEED=${3:-$(date +%s)}
PY=${PYTHON_REF:-/usr/bin/python3}
TESSERA="$top_builddir/src/tessera"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
W=$(mktemp -d "${TMPDIR:-/tmp}/tsr-kill.XXXXXX")
trap 'rm -rf "$W"' EXIT
"$top_srcdir/tools/tsr-prepare" --out "$W/data" --tokenizer bytes /usr/share/games/fortunes/computers \
  >/dev/null || exit 1
C=(model.vocab_size=256 model.n_layer=4 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch="$NP" run.log_every=1
  run.eval_every=0 optim.warmup_steps=2 optim.decay_steps=20 parallel.zero_stage=1
  "data.train=$W/data/train_*.bin" checkpoint.every_steps=3 checkpoint.keep=0 run.max_steps=12)
run() { # run DIR overrides...: appends to DIR.out
  local dir=$1
  shift
  timeout 120 mpirun -np "$NP" "$TESSERA" /dev/null "${C[@]}" run.out_dir="$dir" "$@" >>"$dir.out" 2>&1
}
same() { # same REF RUN: losses, gradient norms and the step-12 checkpoint bitwise
  "$PY" - "$1" "$2" <<'PY'
import json, sys
import h5py, numpy as np
def steps(d):
    out = {}
    for line in open(d + "/metrics.jsonl"):
        r = json.loads(line)
        if "loss" in r:
            out[r["step"]] = (repr(r["loss"]), repr(r["grad_norm"]))
    return out
a, b = steps(sys.argv[1]), steps(sys.argv[2])
fa, fb = (h5py.File(d + "/ckpt/step_00000012.h5", "r") for d in sys.argv[1:3])
names = []
fa.visit(lambda n: names.append(n) if isinstance(fa[n], h5py.Dataset) else None)
bad = [n for n in names if n not in fb or
       not np.array_equal(fa[n][...].view(np.uint32), fb[n][...].view(np.uint32))]
bad += [k for k in ("step", "tokens", "data_cursor") if fa.attrs[k] != fb.attrs[k]]
sys.exit(0 if a == b and len(a) == 12 and names and not bad else 1)
PY
}
pids_of() { # the trainer's processes writing into $1, with their ranks: "PID RANK"
  local p
  for p in $(pgrep -x tessera); do
    tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | grep -q "$1" || continue
    echo "$p $(tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')"
  done
}

run "$W/ref" checkpoint.resume=none || { echo "ckpt_kill.sh: the reference run failed"; cat "$W/ref.out"; exit 1; }
RANDOM=$SEED
echo "kill -9 during a background checkpoint write: $TRIALS trials on $NP ranks (seed $SEED)"
passed=0
for t in $(seq "$TRIALS"); do
  hit=$((3 * (RANDOM % 3 + 1)))
  where=$([ $((RANDOM % 2)) -eq 0 ] && echo start || echo half)
  victim_rank=$((RANDOM % NP))
  ms=$((RANDOM % 1700)) # 0 to 1.7 s into the 2 s pause
  delay=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
  D="$W/t$t"
  TSR_FAULT=ckpt_sleep=2,ckpt_step=$hit,ckpt_where=$where run "$D" checkpoint.resume=none &
  job=$!
  victim=
  for _ in $(seq 600); do
    grep -q "fault injection: sleeping" "$D.out" 2>/dev/null && break
    sleep 0.05
  done
  sleep "$delay"
  victim=$(pids_of "$D" | awk -v r="$victim_rank" '$2 == r {print $1}')
  [ -n "$victim" ] && kill -9 "$victim"
  wait $job
  rc=$?
  before=$([ "$hit" -gt 3 ] && printf 'step_%08d.h5' $((hit - 3)) || echo none)
  latest=$(cat "$D/ckpt/latest" 2>/dev/null || echo none)
  trained=$(grep -c '"loss"' "$D/metrics.jsonl" 2>/dev/null)
  why=
  [ -n "$victim" ] || why="no rank $victim_rank found"
  [ -z "$why" ] && [ $rc -eq 0 ] && why="the job did not fail"
  [ -z "$why" ] && [ -e "$D/ckpt/$(printf 'step_%08d.h5' "$hit")" ] && why="step $hit was published"
  [ -z "$why" ] && [ "$latest" != "$before" ] && why="latest names $latest, not $before"
  if [ -z "$why" ]; then
    run "$D" checkpoint.resume=auto || why="the resume failed"
  fi
  if [ -z "$why" ]; then
    if [ "$before" = none ]; then
      grep -q "initialised from seed" "$D/metrics.jsonl" || why="did not start from the seed"
    else
      grep -q "resumed from .*$before at step" "$D.out" || why="did not resume from $before"
    fi
  fi
  [ -z "$why" ] && ! same "$W/ref" "$D" && why="not bitwise equal to the reference"
  printf 'trial %2d: write of step %d paused (%-5s), rank %d killed %s s in, %2d steps trained; latest %-16s -> %s\n' \
    "$t" "$hit" "$where" "$victim_rank" "$delay" "${trained:-0}" "$latest" "${why:-resumed, bitwise equal}"
  [ -z "$why" ] && passed=$((passed + 1))
  rm -rf "$D"
done
echo "$passed of $TRIALS trials resumed from the previous complete checkpoint (or the seed) and ended bitwise equal"
[ "$passed" -eq "$TRIALS" ]
