#!/usr/bin/env bash
# plot.sh — tools/tsr-plot on a real metrics.jsonl with a restart.  A 1-rank run of a small
# model is stopped by the watchdog in step 16 (checkpoint at 10), then resumed to step 30,
# so steps 11..15 are logged twice and there is a "resume" event at step 10.  The plot must
# be a PNG of the documented size; the summary must name the restart, the 5 redone steps
# and the skipped steps of a copy with two marked skipped; the history may be split over
# two files; blank lines are skipped silently; a record cut short by a run killed mid-write
# (the last line of a file, or followed by the restart, on the next line or on the same
# one) is skipped with a warning naming the file and line; bad input exits nonzero naming
# the file (and line).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
"$PYTHON_REF" -c "import matplotlib" 2>/dev/null || skip "no matplotlib in $PYTHON_REF"
PLOT="$top_srcdir/tools/tsr-plot"
bytes_corpus computers
R="$SCRATCH/run"
C=(model.vocab_size=256 model.n_layer=2 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=32 train.micro_batch=4 train.global_batch=4 optim.warmup_steps=5
  optim.decay_steps=30 run.max_steps=30 run.log_every=10 run.eval_every=5 run.eval_steps=2
  "data.train=$SCRATCH/data/train_*.bin" "data.valid=$SCRATCH/data/valid_*.bin"
  checkpoint.every_steps=10 run.out_dir="$R")

TSR_FAULT=hang_step=16 timeout 60 "$MPIRUN" -np 1 "$TESSERA" /dev/null "${C[@]}" \
  run.step_timeout_s=1 >"$SCRATCH/first.out" 2>&1
check "first run stops in step 16 (watchdog, exit 4)" test $? -eq 4
timeout 60 "$MPIRUN" -np 1 "$TESSERA" /dev/null "${C[@]}" >"$SCRATCH/second.out" 2>&1
check "resumed run finishes" test $? -eq 0
M="$R/metrics.jsonl"
check "metrics.jsonl has a resume at step 10 and step 13 twice" \
  test "$(grep -c '^{"step":10,"event":"resume"' "$M")" -eq 1 -a "$(grep -c '^{"step":13,"loss"' "$M")" -eq 2

lacks() { ! grep -q -F -- "$1" "$2"; }
# png_size FILE: "WIDTH HEIGHT" from a PNG's IHDR chunk, nothing if it is not a PNG.
png_size() {
  [ "$(od -An -tx1 -N8 "$1" | tr -d ' \n')" = 89504e470d0a1a0a ] || return 1
  [ "$(od -An -c -j12 -N4 "$1" | tr -d ' \n')" = IHDR ] || return 1
  od -An -tu1 -j16 -N8 "$1" | awk '{print $1*16777216+$2*65536+$3*256+$4, $5*16777216+$6*65536+$7*256+$8}'
}

"$PLOT" "$R" >"$SCRATCH/plot.out" 2>&1
check "tsr-plot RUN_DIR exits 0" test $? -eq 0
cat "$SCRATCH/plot.out"
check "  ... writes RUN_DIR/plots.png, a PNG of 1200 x 1000 (12 x 10 in at 100 dpi)" \
  test "$(png_size "$R/plots.png")" = "1200 1000"
check "  ... of more than 20 kB (five panels drawn, not an empty canvas)" \
  test "$(stat -c %s "$R/plots.png")" -gt 20000
check "  ... summary: 30 steps, 6 validation losses, restart at 10 redoing 5, none skipped" \
  grep -q "steps up to 30 (30 steps, 6 validation losses), restarts: step 10 (5 redone), skipped: none" \
  "$SCRATCH/plot.out"
if grep -q '"mfu":[0-9]' "$M"; then
  check "  ... MFU is plotted (the trainer records it)" lacks "not recorded: mfu" "$SCRATCH/plot.out"
else
  check "  ... MFU is 'not recorded' (null on every step)" grep -q "not recorded: mfu" "$SCRATCH/plot.out"
fi

# The same history split at the restart into two files, and a copy with skipped steps:
# grad_norm null at step 22, and the skipped count going up to 1 at step 25.
n=$(grep -n '"event":"resume"' "$M" | cut -d: -f1)
head -n $((n - 1)) "$M" >"$SCRATCH/a.jsonl"
tail -n +"$n" "$M" >"$SCRATCH/b.jsonl"
"$PLOT" "$SCRATCH/a.jsonl" "$SCRATCH/b.jsonl" -o "$SCRATCH/split.png" >"$SCRATCH/split.out" 2>&1
check "two files read as one history: same summary, a PNG" \
  grep -q "restarts: step 10 (5 redone), skipped: none.* -> $SCRATCH/split.png" "$SCRATCH/split.out"
sed -E -e '/^\{"step":22,"loss"/s/"grad_norm":[^,]*/"grad_norm":null/' \
  -e '/^\{"step":(2[5-9]|30),"loss"/s/"skipped":0/"skipped":1/' "$M" >"$SCRATCH/skip.jsonl"
"$PLOT" "$SCRATCH/skip.jsonl" -o "$SCRATCH/skip.png" >"$SCRATCH/skip.out" 2>&1
check "skipped steps 22 (null grad norm) and 25 (count up) are found and plotted" \
  grep -q "skipped: 22, 25" "$SCRATCH/skip.out"
check "  ... PNG written" test "$(png_size "$SCRATCH/skip.png")" = "1200 1000"

# Blank lines (empty, spaces, a blank last line) are skipped silently: the same summary.
awk 'NR == 3 { print "" } NR == 5 { print "   " } { print } END { print "" }' "$M" >"$SCRATCH/blank.jsonl"
"$PLOT" "$SCRATCH/blank.jsonl" -o "$SCRATCH/blank.png" >"$SCRATCH/blank.out" 2>"$SCRATCH/blank.err"
rc=$?
cat "$SCRATCH/blank.out" "$SCRATCH/blank.err"
check "blank lines: exit 0, nothing on stderr, the same summary, a PNG" \
  test $rc -eq 0 -a ! -s "$SCRATCH/blank.err" -a "$(png_size "$SCRATCH/blank.png")" = "1200 1000" \
  -a -n "$(grep "30 steps, 6 validation losses), restarts: step 10 (5 redone), skipped: none" "$SCRATCH/blank.out")"

# A record cut short by kill -9 (line c, the last before the resume at line n), then the
# resumed run's lines: after a newline, or (the cut record had none) on the same line, or
# at the end of the first file of a split history.
c=$((n - 1))
awk -v c=$c 'NR == c { print substr($0, 1, 20); next } { print }' "$M" >"$SCRATCH/cut.jsonl"
awk -v c=$c 'NR == c { printf "%s", substr($0, 1, 20); next } { print }' "$M" >"$SCRATCH/joined.jsonl"
head -n $((c - 1)) "$M" >"$SCRATCH/a_cut.jsonl"
sed -n "${c}p" "$M" | head -c 20 >>"$SCRATCH/a_cut.jsonl"
cut_record() { # cut_record NAME WARNED_AT FILES...: exit 0, one warning, the restart found
  local name=$1 at=$2
  shift 2
  "$PLOT" "$@" -o "$SCRATCH/$name.png" >"$SCRATCH/$name.out" 2>"$SCRATCH/$name.err"
  local rc=$?
  cat "$SCRATCH/$name.out" "$SCRATCH/$name.err"
  check "$name: exit 0, a PNG, restart at 10 found, warns '$at: skipped a truncated record'" \
    test $rc -eq 0 -a "$(png_size "$SCRATCH/$name.png")" = "1200 1000" \
    -a "$(cat "$SCRATCH/$name.err")" = "$at: skipped a truncated record (a run killed mid-write)" \
    -a -n "$(grep "steps up to 30 (30 steps, 6 validation losses), restarts: step 10 (" "$SCRATCH/$name.out")"
}
cut_record cut "$SCRATCH/cut.jsonl:$c" "$SCRATCH/cut.jsonl"
cut_record joined "$SCRATCH/joined.jsonl:$c" "$SCRATCH/joined.jsonl"
cut_record last_line "$SCRATCH/a_cut.jsonl:$c" "$SCRATCH/a_cut.jsonl" "$SCRATCH/b.jsonl"

# Bad input: a garbled line 7 (followed by more records, not a restart), an empty file, a
# missing file.
sed '7s/.*/{"step":6,"loss":5.5,"lr/' "$M" >"$SCRATCH/bad.jsonl"
: >"$SCRATCH/empty.jsonl"
expect_error() { # expect_error WHAT TEXT FILE
  "$PLOT" "$3" -o "$SCRATCH/no.png" >"$SCRATCH/err.out" 2>&1
  local rc=$?
  cat "$SCRATCH/err.out"
  check "$1: exit 2, no PNG, the message has '$2'" \
    test $rc -eq 2 -a ! -e "$SCRATCH/no.png" -a "$(grep -c -F -- "$2" "$SCRATCH/err.out")" -eq 1
}
expect_error "garbled line" "$SCRATCH/bad.jsonl:7:" "$SCRATCH/bad.jsonl"
expect_error "empty file" "'$SCRATCH/empty.jsonl' is empty" "$SCRATCH/empty.jsonl"
expect_error "missing file" "cannot read '$SCRATCH/none.jsonl'" "$SCRATCH/none.jsonl"
finish
