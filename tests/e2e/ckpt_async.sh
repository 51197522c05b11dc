#!/usr/bin/env bash
# ckpt_async.sh — asynchronous checkpoints (checkpoint.async; src/ckpt/ckpt_async.c), on the tiny
# llama of ckpt_failures.sh, 2 ranks, dp 2 with ZeRO 1, a checkpoint every 3 steps, the LR
# schedule fixed (decay_steps 20) so that it does not depend on run.max_steps.  The
# reference is the same run with checkpoint.async = .false. (today's synchronous writes).
#  (a) async against sync, 12 steps (checkpoint.async = .true.: this 2-core machine's
#      ranks use every core, where 'auto' writes synchronously): the log says which; every step's loss and gradient
#      norm equal as text (17 digits); the checkpoints of steps 3, 6, 9, 12 hold bitwise
#      equal /model and /optim datasets and step / tokens / data_cursor; the metrics'
#      checkpoint records say async true / false with blocked_s and write_s.
#  (b) resume from an asynchronous checkpoint: 6 steps, stop, resume (auto) to 12: bitwise
#      the uninterrupted run's losses and step-12 checkpoint.
#  (c) at most one write in flight: the write of step 3 pauses 2 s (TSR_FAULT ckpt_sleep):
#      steps 4 and 5 are trained meanwhile (their metrics come before step 3's checkpoint
#      record), step 6's checkpoint waits for it (the log's "waiting for the previous
#      checkpoint write (step 3) took X s", X >= 1, and its blocked_s >= 1), step 3 is
#      published before step 6's write begins, and the losses are (a)'s.
#  (d) a clean stop waits for the write: SIGUSR1 to both ranks while step 3's write pauses
#      3 s: exit 3 at a step S in 3..6 after step 3's write has ended, `latest` names step S,
#      steps 3 and S are complete files; resuming to 12 gives (a)'s losses and checkpoint.
#  (e) kill -9 of a rank during a background write: step 6's write pauses 30 s with its
#      .tmp open while training goes on (step 7's metrics are written); rank 1 is killed:
#      the job fails, step_00000006.h5 does not exist, `latest` still names step 3; the
#      next start resumes from step 3 and ends with (a)'s losses and checkpoint, bitwise.
#  (f) a failing background write (TSR_FAULT ckpt_fail_step=6 on rank 1) fails the run as a
#      failing synchronous write does: every rank of both runs exits 1, `latest` names step
#      3, no step-6 file is left, the async run says the background write of step 6 failed
#      and trained no step past 9 (the failure is agreed at a boundary at the latest when
#      the next checkpoint waits for it).
#  (g) a snapshot that does not fit (TSR_FAULT ckpt_host_mb=1: half of 1 MB is less than
#      the node's 0.6 MB) makes the run write synchronously, and says so;
#  (h) checkpoint.async = 'auto' (the default): 4 ranks on this machine's cores write
#      synchronously and the log says why; one rank of one thread leaves a core free and
#      writes in the background (tests/cuda/cuda_train_emu.sh: a GPU run writes in the
#      background too).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
"$PYTHON_REF" -c "import h5py, numpy" 2>/dev/null || skip "no h5py/numpy in $PYTHON_REF"
bytes_corpus computers
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=4 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.log_every=1
  run.eval_every=0 optim.warmup_steps=2 optim.decay_steps=20 parallel.zero_stage=1
  "data.train=$SCRATCH/data/train_*.bin" checkpoint.every_steps=3 checkpoint.keep=0
  checkpoint.async=.true.)
run() { launch -n 2 -a -o "$@"; } # run NAME overrides... (appends to NAME.out)
ck() { echo "$SCRATCH/$1/ckpt/step_$(printf %08d "$2").h5"; }
compare() { "$PYTHON_REF" - "$@" <<'PY'
import json, sys
import h5py, numpy as np
mode = sys.argv[1]
def steps(path):  # the last line of each step counts (a resumed run repeats some)
    out = {}
    for line in open(path):
        d = json.loads(line)
        if "loss" in d:
            out[d["step"]] = d
    return out
if mode == "metrics":  # A B N: steps 1..N, loss and grad norm equal as text
    a, b = steps(sys.argv[2]), steps(sys.argv[3])
    bad = [s for s in range(1, int(sys.argv[4]) + 1) if s not in a or s not in b or
           repr(a[s]["loss"]) != repr(b[s]["loss"]) or repr(a[s]["grad_norm"]) != repr(b[s]["grad_norm"])]
    print(f"    steps 1..{sys.argv[4]}: {len(bad)} differ{' (first ' + str(bad[0]) + ')' if bad else ''}")
    sys.exit(1 if bad else 0)
if mode == "h5":  # A B: every dataset bitwise, and the state attributes
    fa, fb = h5py.File(sys.argv[2], "r"), h5py.File(sys.argv[3], "r")
    names, other = [], []
    fa.visit(lambda n: names.append(n) if isinstance(fa[n], h5py.Dataset) else None)
    fb.visit(lambda n: other.append(n) if isinstance(fb[n], h5py.Dataset) else None)
    bad = sorted(set(names) ^ set(other))
    bad += [n for n in names if n in fb and
            not np.array_equal(fa[n][...].view(np.uint32), fb[n][...].view(np.uint32))]
    bad += ["@" + k for k in ("step", "tokens", "data_cursor", "complete") if fa.attrs[k] != fb.attrs[k]]
    print(f"    {sys.argv[2].split('/')[-3]} vs {sys.argv[3].split('/')[-3]} "
          f"{sys.argv[2].split('/')[-1]}: {len(names)} datasets, {len(bad)} differ {bad[:3]}")
    sys.exit(1 if bad or len(names) < 3 else 0)
if mode == "records":  # RUN ASYNC: checkpoint records with the new fields, in step order
    recs = [json.loads(l) for l in open(sys.argv[2])]
    ck = [r for r in recs if r.get("event") == "checkpoint"]
    want = sys.argv[3] == "true"
    ok = len(ck) >= 4 and [r["step"] for r in ck] == sorted(r["step"] for r in ck) and all(
        r["async"] is want and r["blocked_s"] >= 0 and r["write_s"] > 0 and
        r["detail"] == "%.3f s" % r["write_s"] and (want or r["blocked_s"] == r["write_s"])
        for r in ck)
    print("    " + ", ".join(f"{r['step']}: blocked {r['blocked_s']:.4f} s, write {r['write_s']:.4f} s" for r in ck))
    sys.exit(0 if ok else 1)
if mode == "overlap":  # RUN: steps 4 and 5 recorded before step 3's checkpoint record
    recs = [json.loads(l) for l in open(sys.argv[2])]
    at = lambda f: next(i for i, r in enumerate(recs) if f(r))
    c3 = at(lambda r: r.get("event") == "checkpoint" and r["step"] == 3)
    c6 = next(r for r in recs if r.get("event") == "checkpoint" and r["step"] == 6)
    s4, s5 = at(lambda r: r.get("step") == 4 and "loss" in r), at(lambda r: r.get("step") == 5 and "loss" in r)
    print(f"    records: step 4 at {s4}, step 5 at {s5}, checkpoint 3 at {c3}; step 6 blocked {c6['blocked_s']:.3f} s")
    sys.exit(0 if s4 < c3 and s5 < c3 and c6["blocked_s"] >= 1.0 else 1)
if mode == "max-step":  # RUN N: no step past N
    last = max(steps(sys.argv[2]))
    print(f"    last step trained: {last}")
    sys.exit(0 if last <= int(sys.argv[3]) else 1)
PY
}
tessera_pids() { # the trainer's processes of the run writing into $1
  local p
  for p in $(pgrep -x tessera); do
    tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | grep -q "$1" && echo "$p"
  done
}
wait_for() { # wait_for SECONDS COMMAND...: poll every 0.1 s
  local i
  for i in $(seq $(($1 * 10))); do
    "${@:2}" && return 0
    sleep 0.1
  done
  return 1
}
has_step() { grep -q "^{\"step\":$2,\"loss\"" "$SCRATCH/$1/metrics.jsonl" 2>/dev/null; }

# ---- (a) async against sync ----
run sync run.max_steps=12 checkpoint.async=.false. checkpoint.resume=none
check "(a) synchronous reference, 12 steps (exit $?)" test $? -eq 0
run async run.max_steps=12 checkpoint.resume=none
check "(a) asynchronous run, 12 steps (exit $?)" test $? -eq 0
check "(a)   ... the log says which" sh -c "grep -q 'checkpoint: synchronous writes (checkpoint.async = .false.)' '$SCRATCH/sync.out' && grep -q 'checkpoint: asynchronous writes (checkpoint.async): a host snapshot of' '$SCRATCH/async.out'"
check "(a)   ... every step's loss and gradient norm equal (17 digits)" \
  compare metrics "$SCRATCH/sync/metrics.jsonl" "$SCRATCH/async/metrics.jsonl" 12
for s in 3 6 9 12; do
  check "(a)   ... step-$s checkpoints bitwise equal" compare h5 "$(ck sync $s)" "$(ck async $s)"
done
check "(a)   ... async checkpoint records: blocked_s and write_s" \
  compare records "$SCRATCH/async/metrics.jsonl" true
check "(a)   ... sync records: blocked_s = write_s" compare records "$SCRATCH/sync/metrics.jsonl" false
check "(a)   ... a log line per background write with both times" \
  test "$(grep -c 'checkpoint: step [0-9]* written in the background in [0-9.]* s; training was held up [0-9.]* s' "$SCRATCH/async.out")" -eq 4

# ---- (b) resume from an asynchronous checkpoint ----
run resume run.max_steps=6 checkpoint.resume=none && run resume run.max_steps=12 checkpoint.resume=auto
check "(b) 6 steps, then a resume to 12 (exit $?)" test $? -eq 0
check "(b)   ... resumed from the step-6 checkpoint" grep -q "resumed from .*step_00000006.h5 at step 6 " "$SCRATCH/resume.out"
check "(b)   ... losses equal the uninterrupted run's" \
  compare metrics "$SCRATCH/async/metrics.jsonl" "$SCRATCH/resume/metrics.jsonl" 12
check "(b)   ... and the step-12 checkpoint" compare h5 "$(ck async 12)" "$(ck resume 12)"

# ---- (c) at most one write in flight ----
TSR_FAULT=ckpt_sleep=2,ckpt_step=3 run inflight run.max_steps=9 checkpoint.resume=none
check "(c) step 3's write pauses 2 s (exit $?)" test $? -eq 0
check "(c)   ... training goes on meanwhile, and step 6 waits for it" \
  compare overlap "$SCRATCH/inflight/metrics.jsonl"
line=$(grep -o "checkpoint: step 6: waiting for the previous checkpoint write (step 3) took [0-9.]* s" "$SCRATCH/inflight.out")
echo "    $line"
check "(c)   ... the log says so, with the wait (>= 1 s)" \
  "$PYTHON_REF" -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 1.0 else 1)" "$(echo "$line" | sed -n 's/.* took \([0-9.]*\) s/\1/p')"
w3=$(grep -n "wrote .*step_00000003.h5 " "$SCRATCH/inflight.out" | cut -d: -f1)
w6=$(grep -n "checkpoint: step 6: waiting for the previous" "$SCRATCH/inflight.out" | cut -d: -f1)
check "(c)   ... step 3 is published before step 6's write starts (lines ${w3:-?} < ${w6:-?})" \
  test -n "$w3" -a -n "$w6" -a "${w3:-0}" -lt "${w6:-0}"
check "(c)   ... losses equal the synchronous run's" \
  compare metrics "$SCRATCH/sync/metrics.jsonl" "$SCRATCH/inflight/metrics.jsonl" 9

# ---- (d) a clean stop waits for the write in flight ----
TSR_FAULT=ckpt_sleep=3,ckpt_step=3 run stop run.max_steps=12 checkpoint.resume=none &
job=$!
sent=0
if wait_for 60 grep -q "fault injection: sleeping" "$SCRATCH/stop.out"; then
  for p in $(tessera_pids "$SCRATCH/stop"); do kill -USR1 "$p" && sent=$((sent + 1)); done
fi
wait $job
rc=$?
check "(d) SIGUSR1 to both ranks ($sent) during step 3's write: exit 3 (got $rc)" test "$sent" -eq 2 -a $rc -eq 3
stop=$(sed -n 's/.*stopped cleanly at step \([0-9]*\) .*/\1/p' "$SCRATCH/stop.out")
echo "    stopped at step ${stop:-?}"
check "(d)   ... at a step from 3 to 6" test "${stop:-0}" -ge 3 -a "${stop:-0}" -le 6
d3=$(grep -n "checkpoint: step 3 written in the background" "$SCRATCH/stop.out" | cut -d: -f1)
ds=$(grep -n "stopped cleanly at step" "$SCRATCH/stop.out" | cut -d: -f1)
check "(d)   ... after step 3's write has ended (lines ${d3:-?} < ${ds:-?})" \
  test -n "$d3" -a -n "$ds" -a "${d3:-0}" -lt "${ds:-0}"
check "(d)   ... latest names step $stop" grep -qx "step_$(printf %08d "${stop:-0}").h5" "$SCRATCH/stop/ckpt/latest"
check "(d)   ... steps 3 and $stop are complete" \
  sh -c "'$PYTHON_REF' -c \"import h5py, sys; sys.exit(0 if all(h5py.File(f, 'r').attrs['complete'] == 1 for f in sys.argv[1:]) else 1)\" '$(ck stop 3)' '$(ck stop "${stop:-0}")'"
run stop run.max_steps=12 checkpoint.resume=auto
check "(d)   ... the resume to 12 finishes (exit $?)" test $? -eq 0
check "(d)   ... with the losses of the run that was not stopped" \
  compare metrics "$SCRATCH/async/metrics.jsonl" "$SCRATCH/stop/metrics.jsonl" 12
check "(d)   ... and its step-12 checkpoint" compare h5 "$(ck async 12)" "$(ck stop 12)"

# ---- (e) kill -9 during a background write ----
TSR_FAULT=ckpt_sleep=30,ckpt_step=6 run kill run.max_steps=12 checkpoint.resume=none &
job=$!
victim=
if wait_for 60 grep -q "fault injection: sleeping .*step_00000006.h5.tmp" "$SCRATCH/kill.out" &&
  wait_for 30 has_step kill 7; then
  for p in $(tessera_pids "$SCRATCH/kill"); do
    tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && victim=$p
  done
fi
check "(e) step 6's write is under way, step 7 trained meanwhile, rank 1 found (${victim:-none})" \
  test -n "$victim" -a -f "$(ck kill 6).tmp"
[ -n "$victim" ] && kill -9 "$victim"
wait $job
rc=$?
check "(e)   ... the job fails (got $rc)" test $rc -ne 0 -a $rc -ne 124
check "(e)   ... no step_00000006.h5" test ! -e "$(ck kill 6)"
check "(e)   ... latest still names step 3" grep -qx "step_00000003.h5" "$SCRATCH/kill/ckpt/latest"
run kill run.max_steps=12 checkpoint.resume=auto
check "(e) the next start finishes (exit $?)" test $? -eq 0
check "(e)   ... resumed from step 3" grep -q "resumed from .*step_00000003.h5 at step 3 " "$SCRATCH/kill.out"
check "(e)   ... losses equal the uninterrupted run's" \
  compare metrics "$SCRATCH/async/metrics.jsonl" "$SCRATCH/kill/metrics.jsonl" 12
check "(e)   ... and the step-12 checkpoint" compare h5 "$(ck async 12)" "$(ck kill 12)"

# ---- (f) a failing background write fails the run like a failing synchronous one ----
for mode in sync async; do
  TSR_FAULT=ckpt_fail_step=6,ckpt_fail_rank=1 launch -n 2 -r "$SCRATCH/fail_$mode.rc" -o "fail_$mode" \
    run.max_steps=12 checkpoint.resume=none checkpoint.async=$([ $mode = async ] && echo T || echo F)
  sed 's/^/    '$mode': /' "$SCRATCH/fail_$mode.rc"
  check "(f) $mode: every rank exits 1" test "$(grep -c '^rank [01] exit 1$' "$SCRATCH/fail_$mode.rc")" -eq 2
  check "(f)   ... latest names step 3, no step-6 file is left" \
    sh -c "grep -qx step_00000003.h5 '$SCRATCH/fail_$mode/ckpt/latest' && ! ls '$SCRATCH/fail_$mode/ckpt' | grep -q step_00000006"
done
check "(f) async: the error names the failed background write" \
  grep -q "error: checkpoint: the background write of step 6 failed" "$SCRATCH/fail_async.out"
check "(f)   ... and no step past 9 was trained" compare max-step "$SCRATCH/fail_async/metrics.jsonl" 9

# ---- (g) a snapshot that does not fit: synchronous writes ----
TSR_FAULT=ckpt_host_mb=1 run nofit run.max_steps=6 checkpoint.resume=none
check "(g) 1 MB available (exit $?)" test $? -eq 0
check "(g)   ... the run writes synchronously and says why" \
  grep -q "checkpoint: synchronous writes: the host snapshots of asynchronous ones would take 0.6 MB on a node with 1 MB available, more than half of it" "$SCRATCH/nofit.out"
check "(g)   ... its checkpoint records say async false" \
  sh -c "grep -q '\"event\":\"checkpoint\",\"detail\":\"[0-9.]* s\",\"async\":false' '$SCRATCH/nofit/metrics.jsonl' && ! grep -q '\"async\":true' '$SCRATCH/nofit/metrics.jsonl'"
check "(g)   ... and its step-6 checkpoint is (a)'s" compare h5 "$(ck sync 6)" "$(ck nofit 6)"

# ---- (h) checkpoint.async = 'auto', the default: by the node's cores ----
launch -n 4 -o auto4 run.max_steps=3 train.global_batch=4 checkpoint.resume=none \
  checkpoint.async=auto
cores=$(getconf _NPROCESSORS_ONLN) # (nproc counts OMP_NUM_THREADS)
check "(h) 'auto', 4 ranks on this machine's $cores cores: synchronous writes, saying why" \
  grep -q "checkpoint: checkpoint.async = 'auto': synchronous writes, this node's 4 rank(s) x 1 thread(s) use all its $cores cores" \
  "$SCRATCH/auto4.out"
check "(h)   ... its checkpoint records say async false" \
  sh -c "grep -q '\"async\":false' '$SCRATCH/auto4/metrics.jsonl' && ! grep -q '\"async\":true' '$SCRATCH/auto4/metrics.jsonl'"
launch -o auto1 run.max_steps=3 checkpoint.resume=none checkpoint.async=auto
check "(h) 'auto', one rank of one thread: a core is free, background writes" \
  grep -q "checkpoint: checkpoint.async = 'auto': background writes, this node's 1 rank(s) x 1 thread(s) leave at least one of its $cores cores free" \
  "$SCRATCH/auto1.out"
check "(h)   ... its checkpoint records say async true" grep -q '"async":true' "$SCRATCH/auto1/metrics.jsonl"
finish
