#!/usr/bin/env bash
# fault_edges.sh — the edges a fault campaign found, one check each (every one failed on
# the tree before its fix):
#  (a) a stop signal in a rank's first half second (SIGUSR1 or SIGTERM to one rank of a
#      2-rank layout, 0.05-0.5 s after mpirun starts it, 10 trials): every trial ends with
#      exit 3 (stopped cleanly) or 0 (the signal missed the rank), none killed by the
#      signal (the ranks used to die in the dynamic loader's tens of milliseconds, before
#      any handler of theirs was installed);
#  (b) an empty deck, a deck with only a comment, and a directory given as the deck are
#      bad input (exit 2) naming the file; /dev/null still means "the defaults and the
#      overrides";
#  (c) a key with a character keys cannot have ('n_läyer') is named as such, not read as
#      a second value of the key before it;
#  (d) a directory in the place of a checkpoint file the run will write: the resume falls
#      back to the older checkpoint, and the run refuses before its first step with exit 2
#      naming the directory (it used to fail at the write, exit 1, on every requeue);
#  (e) a newest checkpoint missing a root attribute (data_cursor) is skipped like any
#      other damage: the resume falls back to the older one with a warning (it used to
#      stop with exit 2);
#  (f) `latest` lagging behind a newer complete checkpoint (a job killed between the two
#      renames): resume = 'auto' takes the newest complete one and says so; but a step
#      file older than `latest` itself (a resume from an earlier checkpoint abandoned it)
#      is left out, saying so.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
"$PYTHON_REF" -c "import h5py" 2>/dev/null || skip "no h5py in $PYTHON_REF"
bytes_corpus computers
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=2 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.log_every=1000
  run.eval_every=0 "data.train=$SCRATCH/data/train_*.bin" checkpoint.keep=0)

# ---- (a) stop signals in the first half second ----
export OMPI_MCA_mpi_yield_when_idle=1
trial() { # trial N DELAY SIGNAL LAYOUT...: one 2-rank run, SIGNAL to its second rank
  local n=$1 d=$2 sig=$3 pid='' k
  shift 3
  "$MPIRUN" -np 2 "$TESSERA" /dev/null "${C[@]}" run.max_steps=400 checkpoint.resume=none \
    checkpoint.every_steps=0 run.out_dir="$SCRATCH/sig$n" "$@" >"$SCRATCH/sig$n.out" 2>&1 &
  local job=$!
  sleep "$d"
  # this job's ranks (its run.out_dir; not mpirun itself), oldest first: the second one.
  # (other tests run beside this one: only this trial's processes are signalled)
  for k in $(seq 50); do
    pid=$(pgrep -f "run.out_dir=$SCRATCH/sig$n( |\$)" | grep -vx "$job" |
      xargs -r ps -o pid= --sort=start_time -p | sed -n 2p | tr -d ' ')
    [ -n "$pid" ] && break
    sleep 0.01
  done
  [ -n "$pid" ] && kill -"$sig" "$pid" 2>/dev/null
  timeout 120 tail --pid=$job -f /dev/null
  wait $job
  local rc=$?
  echo "    trial $n: $sig at ${d}s to pid ${pid:-none} ($*): exit $rc"
  [ $rc -eq 3 ] || [ $rc -eq 0 ] || { grep -h "exited on signal\|error" "$SCRATCH/sig$n.out" | head -3; return 1; }
}
n=0 ok=0
for d in 0.05 0.06 0.07 0.08 0.1 0.12 0.15 0.2 0.3 0.5; do
  n=$((n + 1))
  case $((n % 3)) in
    0) L=(parallel.tp=2) S=USR1 ;;
    1) L=(parallel.zero_stage=1) S=TERM ;;
    *) L=(parallel.pp=2) S=USR1 ;;
  esac
  trial $n $d $S "${L[@]}" && ok=$((ok + 1))
done
check "(a) 10 stop signals 0.05-0.5 s after launch: every job exit 3 or 0 ($ok of 10)" test $ok -eq 10

# ---- (b) decks that are not decks ----
: >"$SCRATCH/empty.nml"
printf '! only a comment\n' >"$SCRATCH/comment.nml"
mkdir -p "$SCRATCH/adir"
for d in empty comment; do
  "$TESSERA" "$SCRATCH/$d.nml" "${C[@]}" run.max_steps=1 run.out_dir="$SCRATCH/d$d" >"$SCRATCH/d$d.out" 2>&1
  check "(b) the $d deck: exit 2 (exit $?)" test $? -eq 2
  check "(b) ... naming the file and the way to train on the defaults" grep -q \
    "$d.nml:1:1: .*a deck needs at least one group .*give /dev/null as the deck" "$SCRATCH/d$d.out"
done
"$TESSERA" "$SCRATCH/adir" "${C[@]}" run.max_steps=1 >"$SCRATCH/dadir.out" 2>&1
check "(b) a directory as the deck: exit 2 (exit $?)" test $? -eq 2
check "(b) ... saying it is a directory" grep -q "adir: is a directory, not a deck" "$SCRATCH/dadir.out"
"$TESSERA" /dev/null "${C[@]}" run.max_steps=1 checkpoint.resume=none run.out_dir="$SCRATCH/dnull" \
  >"$SCRATCH/dnull.out" 2>&1
check "(b) /dev/null and overrides still train (exit $?)" test $? -eq 0

# ---- (c) a key with a character keys cannot have ----
printf "&model\n  arch = 'llama'\n  n_l\xc3\xa4yer = 4\n/\n" >"$SCRATCH/umlaut.nml"
"$TESSERA" "$SCRATCH/umlaut.nml" "${C[@]}" run.max_steps=1 >"$SCRATCH/umlaut.out" 2>&1
check "(c) 'n_läyer': exit 2 (exit $?)" test $? -eq 2
check "(c) ... the key's character named at its column" grep -q \
  "umlaut.nml:3:6: key 'n_läyer' in &model has 'ä', which keys cannot have" "$SCRATCH/umlaut.out"
check "(c) ... and not taken for a second value of arch" sh -c "! grep -q 'arch expects one value' '$SCRATCH/umlaut.out'"

# ---- (d, e, f) the checkpoint directory ----
launch -o ck run.max_steps=6 checkpoint.every_steps=2 checkpoint.resume=none
check "(d) a run with checkpoints at 2, 4, 6 (exit $?)" test -f "$SCRATCH/ck/ckpt/step_00000006.h5"
K=$SCRATCH/ck/ckpt
cp -a "$K" "$SCRATCH/ck.orig" # (-a: the files keep their times, which resume compares)
restore() { rm -rf "$K" && cp -a "$SCRATCH/ck.orig" "$K"; }
# (d) step 6 is a directory: back to 4, and the run that would write 6 again refuses
rm "$K/step_00000006.h5" && mkdir "$K/step_00000006.h5"
launch -o ck -l dir run.max_steps=8 checkpoint.every_steps=2 checkpoint.resume=auto
check "(d) a directory at step_00000006.h5: exit 2 before the first step (exit $?)" test $? -eq 2
check "(d) ... the resume fell back to step 4 first" grep -q "resumed from .*step_00000004.h5" "$SCRATCH/dir.out"
check "(d) ... naming the directory and where the run writes" grep -q \
  "step_00000006.h5' is a directory, where the run writes a checkpoint: .*move it away" "$SCRATCH/dir.out"
check "(d) ... before any step ran" sh -c "! grep -q '^step ' '$SCRATCH/dir.out'"
# (e) the newest file lacks data_cursor: skipped like damage
restore
"$PYTHON_REF" -c "import h5py, sys; f = h5py.File(sys.argv[1], 'a'); del f.attrs['data_cursor']" \
  "$K/step_00000006.h5"
launch -o ck -l attr run.max_steps=7 checkpoint.every_steps=0 checkpoint.resume=auto
check "(e) the newest checkpoint lacks data_cursor: the run goes on (exit $?)" test $? -eq 0
check "(e) ... warning it is unusable for that reason" grep -q \
  "step_00000006.h5' (named by 'latest') is unusable: lacks the root attribute 'data_cursor'; falling back" \
  "$SCRATCH/attr.out"
check "(e) ... and resuming from step 4" grep -q "resumed from .*step_00000004.h5 at step 4" "$SCRATCH/attr.out"
# (f) latest names step 4 while step 6 is complete and newer than latest (the job ended
# between publishing step 6 and updating latest: latest keeps step 4's time)
restore
echo step_00000004.h5 >"$K/latest"
touch -r "$K/step_00000004.h5" "$K/latest"
launch -o ck -l lag run.max_steps=7 checkpoint.every_steps=0 checkpoint.resume=auto
check "(f) 'latest' lagging: the run goes on (exit $?)" test $? -eq 0
check "(f) ... from the newest complete checkpoint, step 6" grep -q "resumed from .*step_00000006.h5 at step 6" "$SCRATCH/lag.out"
check "(f) ... saying 'latest' lagged" grep -q \
  "'latest' names step_00000004.h5, but step_00000006.h5 is newer and complete" "$SCRATCH/lag.out"
# (f') the same names, but latest written after step 6 (a resume from step 4 abandoned 6)
restore
sleep 0.01
echo step_00000004.h5 >"$K/latest"
launch -o ck -l abandoned run.max_steps=5 checkpoint.every_steps=0 checkpoint.resume=auto
check "(f') 'latest' newer than the step-6 file: resumed from step 4 (exit $?)" grep -q \
  "resumed from .*step_00000004.h5 at step 4" "$SCRATCH/abandoned.out"
check "(f') ... saying step 6 is from an abandoned run" grep -q \
  "step_00000006.h5' is past the checkpoint 'latest' names (step_00000004.h5) but older than 'latest' itself" \
  "$SCRATCH/abandoned.out"
finish
