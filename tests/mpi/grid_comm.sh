#!/bin/bash
# grid_comm.sh — the MPI tests of grid and comm under their declared rank counts:
#   test_comm on 1, 2, 3 and 4 ranks;
#   test_grid on 1, 2, 4 and 8 ranks over (tp, pp, ranks_per_node, shard_scope) layouts,
#   with the expected node count and dp_shard size worked out by hand;
#   bad layouts: exit 2 on every rank, exactly one "error:" line, and no hang (`timeout
#   120`, far above the second a bad layout takes: a limit against hangs, not a speed test);
#   the layout table of a synthetic 4096-rank grid stays short.
# Env (from the harness): top_srcdir, top_builddir, MPIRUN.  Exit 0 pass, 1 fail, 77 skip.
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
. "$top_srcdir/tests/lib.sh"
MPIRUN=${MPIRUN:-mpirun}
GRID="$top_builddir/tests/mpi/test_grid"
COMM="$top_builddir/tests/mpi/test_comm"
[ -x "$GRID" ] && [ -x "$COMM" ] || skip "tests/mpi/test_grid or tests/mpi/test_comm is not built"
command -v "${MPIRUN%% *}" >/dev/null || skip "$MPIRUN not found"
scratch

# mpi NP ARGS...: run under a 120 s limit against hangs, output in $SCRATCH/out, exit status
# in $rc.
mpi() {
  local np=$1
  shift
  timeout 120 $MPIRUN -np "$np" "$@" >"$SCRATCH/out" 2>&1
  rc=$?
}
show() { sed 's/^/    /' "$SCRATCH/out" | tail -40; }

# ---- comm ----
for np in 1 2 3 4; do
  mpi "$np" "$COMM"
  if [ "$rc" -eq 0 ] && grep -q '^test_comm: .* 0 failed' "$SCRATCH/out"; then
    ok "test_comm on $np rank(s): $(grep -c '^PASS' "$SCRATCH/out") checks"
  else
    bad "test_comm on $np rank(s) (exit $rc)"
    grep -v '^PASS' "$SCRATCH/out" | sed 's/^/    /' | tail -40
  fi
done

# ---- grid: good layouts ----
# "NP | test_grid arguments" (nodes = expected node count; shard = expected dp_shard size
# for shard_scope 'node').  rpn unset means detected: one node on this machine.
good=(
  "1 | tp=1 pp=1 nodes=1"
  "2 | tp=2 nodes=1"
  "2 | pp=2 nodes=1"
  "2 | scope=node nodes=1 shard=2"
  "2 | rpn=1 scope=node nodes=2 shard=1"
  "4 | tp=2 pp=2 nodes=1"
  "4 | tp=1 rpn=2 scope=node nodes=2 shard=2"
  "4 | tp=2 rpn=2 scope=node nodes=2 shard=1"
  "4 | pp=2 rpn=1 scope=node nodes=4 shard=1"
  "4 | scope=2 nodes=1"
  "8 | tp=2 rpn=4 scope=node nodes=2 shard=2 log=1"
  "8 | tp=2 pp=2 rpn=4 scope=node nodes=2 shard=2"
  "8 | pp=2 rpn=2 scope=node nodes=4 shard=2"
  "8 | rpn=4 scope=node nodes=2 shard=4"
  "8 | tp=2 rpn=2 scope=4 nodes=4"
  "8 | scope=2 nodes=1"
  "8 | tp=4 pp=2 rpn=8 nodes=1"
  "8 | tp=8 nodes=1"
  "8 | pp=8 rpn=1 scope=node nodes=8 shard=1 mb=2 gb=2"
)
for case in "${good[@]}"; do
  np=${case%% |*}
  args=${case#*| }
  mpi "$np" "$GRID" $args
  if [ "$rc" -eq 0 ] && grep -q '^test_grid: .* 0 failed' "$SCRATCH/out"; then
    ok "grid on $np ranks: $args"
  else
    bad "grid on $np ranks: $args (exit $rc)"
    show
  fi
done

# The layout table of the 8-rank, 2-node example names the groups as expected.
table_ok() {
  grep -q '^grid: tp .*{0,1}@n0 {2,3}@n0 {4,5}@n1 {6,7}@n1' "$SCRATCH/out" &&
    grep -q '^grid: dp_shard .*{0,2}@n0 {4,6}@n1 {1,3}@n0 {5,7}@n1' "$SCRATCH/out" &&
    grep -q '^grid: dp_replicate .*{0@n0,4@n1} {2@n0,6@n1}' "$SCRATCH/out" &&
    grep -q '^grid: node .*{0-3}@n0 {4-7}@n1' "$SCRATCH/out"
}
mpi 8 "$GRID" tp=2 rpn=4 scope=node nodes=2 shard=2 log=1
if [ "$rc" -eq 0 ] && table_ok; then
  ok "layout table of 8 ranks, tp 2, 2 nodes: tp, dp_shard, dp_replicate, node rows"
else
  bad "layout table of 8 ranks, tp 2, 2 nodes (exit $rc)"
  show
fi

# ---- grid: bad layouts fail on every rank with one message and exit 2 ----
# "NP | arguments | text the message must contain"
badcases=(
  "6 | tp=4 | world size 6 is not a multiple of parallel.tp = 4 * parallel.pp = 1 = 4"
  "6 | tp=2 pp=2 | world size 6 is not a multiple of parallel.tp = 2 * parallel.pp = 2 = 4"
  "4 | tp=1 mb=3 gb=8 | train.global_batch = 8 is not a multiple of train.micro_batch = 3 * dp 4 = 12"
  "8 | rpn=3 | the 3 ranks per node do not divide the world size 8"
  "8 | tp=4 rpn=2 | parallel.tp = 4 is larger than the 2 ranks per node"
  "6 | tp=2 rpn=3 gb=6 | parallel.tp = 2 does not divide the 3 ranks per node"
  "8 | tp=2 scope=3 | parallel.shard_scope = '3' does not divide dp = 4"
  "6 | pp=2 rpn=2 scope=node gb=6 | the dp x tp = 3 ranks of a pipeline stage and the 2 ranks of a node must divide"
  "2 | scope=-3 | parallel.shard_scope = '-3' is not 'global', 'node' or a positive"
)
for case in "${badcases[@]}"; do
  IFS='|' read -r np args want <<<"$case"
  np=${np// /}
  args=$(echo $args)
  want=${want# }
  mpi "$np" "$GRID" $args expect_rc=2
  n_err=$(grep -c 'error:' "$SCRATCH/out")
  if [ "$rc" -eq 2 ] && [ "$n_err" -eq 1 ] && grep -qF -- "$want" "$SCRATCH/out" &&
    grep -q '^PASS: tsr_grid_create returned 2 on every rank' "$SCRATCH/out"; then
    ok "bad layout on $np ranks ($args): exit 2 everywhere, one message"
  else
    bad "bad layout on $np ranks ($args): exit $rc (124 = hung), $n_err error lines, wanted '$want'"
    show
  fi
done

# ---- the layout table stays compact for a large world ----
mpi 1 "$GRID" fake_world=4096 tp=8 pp=8 rpn=8 shard=8
lines=$(grep -c '^grid:' "$SCRATCH/out")
if [ "$rc" -eq 0 ] && [ "$lines" -le 60 ] && grep -q '… (496 more)' "$SCRATCH/out" &&
  grep -q '^grid: world 4096 = tp 8 x dp 64 x pp 8 on 512 nodes x 8 ranks' "$SCRATCH/out"; then
  ok "layout table of a 4096-rank grid: $lines lines, groups elided"
else
  bad "layout table of a 4096-rank grid (exit $rc, $lines lines)"
  show
fi

finish
