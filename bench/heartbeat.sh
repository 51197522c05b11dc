#!/usr/bin/env bash
# heartbeat.sh — what the heartbeat (run.heartbeat_s) costs and how fast it ends a job.
#  1. Step time with the heartbeat off (the reference), at the default 10 s (a beat a
#     second) and at 1 s (a beat every 0.25 s): NP ranks of dp on a llama of d_model 256 x
#     4 layers, STEPS steps, the median step_ms of metrics.jsonl over steps 3..STEPS; the
#     three runs alternate REPS times and the medians of the medians are compared.
#  2. Detection: a 4-rank run is frozen by SIGSTOP of rank 2 once its steps are under way;
#     the time from the SIGSTOP to mpirun's exit, for heartbeat_s 2, 5 and 10.
#  3. The heartbeat thread's own CPU time (tsr-heartbeat, from /proc/PID/task/TID/schedstat)
#     after 30 s of a 4-rank run of a tiny model, at heartbeat_s 10 and 1, beside the whole
#     process's.
# Prints the ratios; never fails on time.
# Usage: bench/heartbeat.sh [NP] [STEPS] [REPS]   (top_builddir / top_srcdir as for the tests)
set -u
top_srcdir=${top_srcdir:-.}; top_builddir=${top_builddir:-.}
NP=${1:-2}; STEPS=${2:-60}; REPS=${3:-3}
TESSERA="$top_builddir/src/tessera"
PY=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
W=$(mktemp -d /tmp/tsr-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
"$top_srcdir/tools/tsr-prepare" --out "$W/data" --tokenizer bytes /usr/share/games/fortunes/computers >/dev/null
C=(model.vocab_size=256 model.n_layer=4 model.d_model=256 model.n_head=4 model.n_kv_head=4
  model.d_ff=768 model.seq_len=64 train.micro_batch=2 run.eval_every=0 run.log_every=100000
  checkpoint.resume=none checkpoint.every_steps=0 "data.train=$W/data/train_*.bin")
median_ms() { # metrics.jsonl: the median step_ms over steps 3..
  $PY - "$1" <<'PY'
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1])]
print(f"{statistics.median(x['step_ms'] for x in r if 'step_ms' in x and x['step'] >= 3):.2f}")
PY
}

declare -A ms
for rep in $(seq "$REPS"); do
  for hb in 0 10 1; do
    out="$W/run_${hb}_$rep"
    mpirun -np "$NP" "$TESSERA" /dev/null "${C[@]}" train.global_batch=$((2 * NP)) \
      run.max_steps="$STEPS" run.heartbeat_s=$hb run.out_dir="$out" >"$out.log" 2>&1 ||
      { echo "run heartbeat_s=$hb failed:"; tail -5 "$out.log"; exit 1; }
    ms[$hb]="${ms[$hb]:-} $(median_ms "$out/metrics.jsonl")"
  done
done
echo "step time, $NP ranks, $STEPS steps, medians of $REPS runs each (ms per step: each run's median)"
printf '%-22s %10s %8s   %s\n' "run.heartbeat_s" "ms/step" "ratio" "runs"
ref=$($PY -c 'import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))' ${ms[0]})
for hb in 0 10 1; do
  m=$($PY -c 'import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))' ${ms[$hb]})
  printf '%-22s %10.2f %8.3f   %s\n' "$hb$([ "$hb" = 0 ] && echo ' (off, reference)')" "$m" \
    "$($PY -c "print($m / $ref)")" "${ms[$hb]# }"
done

echo
echo "detection: SIGSTOP of rank 2 of 4 during training, time to the end of the job"
printf '%-16s %10s %12s   %s\n' "run.heartbeat_s" "ended (s)" "ended / T" "exit code, the line"
for hb in 2 5 10; do
  out="$W/stop_$hb"
  timeout 300 mpirun -np 4 "$TESSERA" /dev/null "${C[@]}" model.d_model=64 model.d_ff=192 \
    train.global_batch=8 run.max_steps=1000000 run.heartbeat_s=$hb run.out_dir="$out" \
    >"$out.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do grep -qs '"loss"' "$out/metrics.jsonl" && break; sleep 0.1; done
  sleep 2
  victim=
  for p in $(pgrep -x tessera); do
    tr '\0' ' ' 2>/dev/null </proc/"$p"/cmdline | grep -q "run.out_dir=$out" &&
      tr '\0' '\n' 2>/dev/null </proc/"$p"/environ | grep -qx OMPI_COMM_WORLD_RANK=2 && victim=$p
  done
  [ -n "$victim" ] || { echo "rank 2 of the heartbeat_s=$hb run not found"; kill $job; exit 1; }
  t0=$(date +%s.%N)
  kill -STOP "$victim"
  wait $job
  rc=$?
  t1=$(date +%s.%N)
  line=$(grep -m1 -o "heartbeat: rank [0-9]* (host [^)]*) has not been heard from for [0-9.]* s" "$out.log")
  printf '%-16s %10.1f %12.2f   %s, %s\n' "$hb" "$($PY -c "print($t1 - $t0)")" \
    "$($PY -c "print(($t1 - $t0) / $hb)")" "$rc" "${line:-no heartbeat line}"
done

echo
echo "CPU time of the heartbeat thread after 30 s of training, 4 ranks"
printf '%-16s %-28s %s\n' "run.heartbeat_s" "thread, ranks 0 1 2 3 (ms)" "whole process, ranks 0 1 2 3 (ms)"
for hb in 10 1; do
  out="$W/cpu_$hb"
  timeout 300 mpirun -np 4 "$TESSERA" /dev/null "${C[@]}" model.d_model=32 model.d_ff=96 \
    model.seq_len=16 train.micro_batch=1 train.global_batch=4 run.max_steps=100000000 \
    run.heartbeat_s=$hb run.out_dir="$out" >"$out.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do grep -qs '"loss"' "$out/metrics.jsonl" && break; sleep 0.1; done
  sleep 30
  thread=() whole=() pids=()
  for r in 0 1 2 3; do
    for p in $(pgrep -x tessera); do
      tr '\0' ' ' 2>/dev/null </proc/"$p"/cmdline | grep -q "run.out_dir=$out" &&
        tr '\0' '\n' 2>/dev/null </proc/"$p"/environ | grep -qx OMPI_COMM_WORLD_RANK=$r && pids+=("$p")
    done
  done
  for p in "${pids[@]}"; do
    t=0 all=0
    for task in /proc/"$p"/task/*; do
      ns=$(cut -d' ' -f1 "$task/schedstat")
      all=$((all + ns))
      [ "$(cat "$task/comm")" = tsr-heartbeat ] && t=$ns
    done
    thread+=($((t / 1000000))) whole+=($((all / 1000000)))
  done
  printf '%-16s %-28s %s\n' "$hb" "${thread[*]}" "${whole[*]}"
  kill -USR1 "${pids[0]}"
  wait $job
done
