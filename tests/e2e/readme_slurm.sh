#!/usr/bin/env bash
# readme_slurm.sh — README.md's Slurm runbook blocks, run as written (tests/lib.sh
# readme_block, nothing appended) on a throw-away two-node cluster (tests/e2e/slurm_cluster.sh)
# from a scratch directory set up as the top of a source tree (readme_tree: jobs/, input/,
# the fortunes corpus as data/fortunes, the built trainer as the `tessera` on PATH, which
# the job scripts find).  The cluster is fresh, so the first job is job 1, as the README's
# watch block assumes.  In order, each on what the blocks before it left:
#   slurm-submit   the smoke job: 20 steps of tiny on 2 nodes x 2 ranks (tp 2 x dp 2); the
#                  job ends COMPLETED with exit 0 and a checkpoint at step 20
#   slurm-watch    squeue, scontrol show job 1, tail of smoke-1.out and of metrics.jsonl
#   slurm-layout   the same run resubmitted on 1 node x 2 ranks as 2 pipeline stages to
#                  step 40: the log names the step-20 checkpoint and the samples it had
#                  consumed (320), as the README says
#   slurm-branch   a new OUT_DIR started from the step-30 checkpoint the README names (which
#                  must still be there under the deck's checkpoint.keep), trained to 40
# Skips (77) when Slurm or munge is not installed, or not as root (slurmd).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
. "$top_srcdir/tests/e2e/slurm_cluster.sh"
tsr_slurm_test_setup
corpus
W=$SCRATCH/top
readme_tree "$W"
unset TESSERA # the job scripts find the `tessera` readme_tree put first on PATH
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_rmaps_base_oversubscribe

tsr_slurm_start 2 4 || { bad "the local Slurm cluster starts"; finish; }

# job_of FILE: the id of the job the block's `sbatch` submitted ("Submitted batch job N")
job_of() { sed -n 's/^Submitted batch job \([0-9][0-9]*\).*/\1/p' "$1.out" | tail -n 1; }
# ended_ok JOB: the job ended COMPLETED with exit code 0:0 (the smoke script's exit)
ended_ok() {
  local job=$1 s e
  tsr_slurm_wait "$job" 600 || return 1
  s=$(tsr_slurm_field "$job" JobState) e=$(tsr_slurm_field "$job" ExitCode)
  echo "    job $job: JobState=$s ExitCode=$e"
  [ "$s $e" = "COMPLETED 0:0" ]
}
# last_step DIR: the last step with a loss line in DIR/metrics.jsonl
last_step() {
  "$PYTHON_REF" -c 'import json, sys
s = [json.loads(l)["step"] for l in open(sys.argv[1]) if "\"loss\"" in l]
print(s[-1] if s else 0)' "$1/metrics.jsonl" 2>/dev/null || echo 0
}
show_tail() { echo "    --- $1 (last 20 lines)"; tail -n 20 "$1" 2>/dev/null | sed 's/^/    /'; }

# ---- submit ----
J1=
if readme_block slurm-submit "$SCRATCH/submit.sh"; then
  readme_run slurm-submit "$W" "$SCRATCH/submit.sh" 60
  J1=$(job_of "$SCRATCH/submit.sh")
  check "  ... sbatch said which job it submitted: job 1 on a fresh cluster (got '$J1')" test "$J1" = 1
fi
if [ -n "$J1" ]; then
  ended_ok "$J1" || show_tail "$W/smoke-$J1.out"
  check "  ... the smoke job ends COMPLETED with exit 0" test "$(tsr_slurm_field "$J1" JobState) $(tsr_slurm_field "$J1" ExitCode)" = "COMPLETED 0:0"
  check "  ... it trained to step 20 ($(last_step "$W/out/smoke"))" test "$(last_step "$W/out/smoke")" = 20
  check "  ... and wrote out/smoke/ckpt/step_00000020.h5" test -f "$W/out/smoke/ckpt/step_00000020.h5"
  check "  ... its output is smoke-1.out in the submit directory, with the job's lines" \
    grep -q '\[job 1\] step exit code 0' "$W/smoke-1.out"
fi

# ---- watch (the job has ended; scontrol still knows it for MinJobAge seconds) ----
if readme_block slurm-watch "$SCRATCH/watch.sh"; then
  readme_run slurm-watch "$W" "$SCRATCH/watch.sh" 60
  check "  ... scontrol showed the job's state and exit code" \
    grep -q 'JobState=COMPLETED' "$SCRATCH/watch.sh.out"
  check "  ... the metrics' last line is step 20's" \
    grep -q '"step":20' "$SCRATCH/watch.sh.out"
fi

# ---- the same run on another layout ----
# job_block NAME: README.md's block NAME (in $SCRATCH/NAME.sh, from readme_block) run as
# written; its job waited for and checked to end COMPLETED with exit 0
job_block() {
  local name=$1 f=$SCRATCH/$1.sh job
  readme_run "$name" "$W" "$f" 60 || return 1
  job=$(job_of "$f")
  [ -n "$job" ] || { bad "  ... sbatch said which job it submitted"; return 1; }
  ended_ok "$job"
  local rc=$?
  [ $rc -eq 0 ] || show_tail "$W/smoke-$job.out"
  check "  ... job $job ends COMPLETED with exit 0" test $rc -eq 0
}
readme_block slurm-layout "$SCRATCH/slurm-layout.sh" && job_block slurm-layout
check "  ... it trained to step 40 ($(last_step "$W/out/smoke"))" \
  test "$(last_step "$W/out/smoke")" = 40
check "  ... the log says what the README quotes: resumed from the step-20 checkpoint, 320 samples" \
  grep -q 'resumed from out/smoke/ckpt/step_00000020.h5 at step 20 (320 samples consumed)' \
  "$W/out/smoke/tessera.log"
check "  ... on one node as 2 pipeline stages" \
  grep -q 'grid: world 2 = tp 1.* x dp 1 x pp 2 on 1 node' "$W/out/smoke/tessera.log"

# ---- branch from a named checkpoint ----
check "the checkpoint the README's branch names is still there (checkpoint.keep)" \
  test -f "$W/out/smoke/ckpt/step_00000030.h5"
readme_block slurm-branch "$SCRATCH/slurm-branch.sh" && job_block slurm-branch
check "  ... the branch trains steps 31..40 into out/branch ($(last_step "$W/out/branch"))" \
  test "$(last_step "$W/out/branch")" = 40
check "  ... starting from the named file" \
  grep -q 'resumed from out/smoke/ckpt/step_00000030.h5 at step 30' "$W/out/branch/tessera.log"
finish
