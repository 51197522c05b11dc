#!/usr/bin/env bash
# plot.sh — tools/tsr-plot on a real metrics.jsonl with a restart.  A 1-rank run of a small
# model is stopped by the watchdog in step 16 (checkpoint at 10), then resumed to step 30,
# so steps 11..15 are logged twice and there is a "resume" event at step 10.  The plot must
# be a PNG of the documented size; the summary must name the restart, the 5 redone steps
# and the skipped steps of a copy with two marked skipped; the history may be split over
# two files; blank lines are skipped silently; a record cut short by a run killed mid-write
# (the last line of a file, or followed by the restart, on the next line or on the same
# one) is skipped with a warning naming the file and line; bad input exits nonzero naming
# the file (and line).  --tensorboard writes event files that TensorBoard's own reader
# (EventAccumulator, from the project's .venv) reads back as metrics.jsonl's loss series.
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

# Runs compared: two run directories are two lines (a colour each) on the same axes, named
# by the directory ("run") or by run.name ("beta", a 10-step run of its own), with both
# names in the legend; neither is drawn as a restart of the other.
timeout 60 "$MPIRUN" -np 1 "$TESSERA" /dev/null "${C[@]}" run.max_steps=10 run.name=beta \
  run.out_dir="$SCRATCH/b_dir" >"$SCRATCH/beta.out" 2>&1
check "a second run (run.name beta, 10 steps) finishes" test $? -eq 0
"$PLOT" "$R" "$SCRATCH/b_dir" --dump -o "$SCRATCH/two.png" >"$SCRATCH/two.out" 2>&1
check "two run dirs: exit 0, a PNG" test $? -eq 0 -a "$(png_size "$SCRATCH/two.png")" = "1200 1000"
cat "$SCRATCH/two.out"
check "  ... one loss line per run: 'run' 30 points, 'beta' 10, in two colours" \
  test "$(grep -c ": line loss: " "$SCRATCH/two.out")" -eq 2 \
  -a -n "$(grep "^dump: run 1 'run': line loss: 30 points, steps 1-30" "$SCRATCH/two.out")" \
  -a -n "$(grep "^dump: run 2 'beta': line loss: 10 points, steps 1-10" "$SCRATCH/two.out")" \
  -a -n "$(grep "^dump: run 1 'run': colour C0" "$SCRATCH/two.out")" \
  -a -n "$(grep "^dump: run 2 'beta': colour C1" "$SCRATCH/two.out")"
check "  ... both names in the legend" grep -q "^dump: legend 'run', 'beta'," "$SCRATCH/two.out"
check "  ... the second run is no restart of the first (no 'fresh start')" \
  test "$(grep -c "marker" "$SCRATCH/two.out")" -eq 1 -a -z "$(grep "fresh start" "$SCRATCH/two.out")" \
  -a -n "$(grep "^tsr-plot: beta (.*): steps up to 10 (10 steps, 2 validation losses), restarts: none" "$SCRATCH/two.out")"

# A run stopped at step 10 on one rank and resumed to 20 on two (tp 2): one line, one
# restart marker that names the new layout.
L="$SCRATCH/layout"
timeout 60 "$MPIRUN" -np 1 "$TESSERA" /dev/null "${C[@]}" run.max_steps=10 run.out_dir="$L" \
  >"$SCRATCH/l1.out" 2>&1
check "layout run: 10 steps on 1 rank" test $? -eq 0
timeout 60 "$MPIRUN" -np 2 "$TESSERA" /dev/null "${C[@]}" run.max_steps=20 run.out_dir="$L" \
  parallel.tp=2 >"$SCRATCH/l2.out" 2>&1
check "  ... resumed to 20 on tp 2" test $? -eq 0
"$PLOT" "$L" --dump >"$SCRATCH/layout.out" 2>&1
check "  ... plotted: exit 0, RUN_DIR/plots.png" test $? -eq 0 -a "$(png_size "$L/plots.png")" = "1200 1000"
cat "$SCRATCH/layout.out"
check "  ... one run, one loss line of 20 points" \
  test "$(grep -c "^dump: run .*: line loss:" "$SCRATCH/layout.out")" -eq 1 \
  -a -n "$(grep "^dump: run 1 'layout': line loss: 20 points, steps 1-20" "$SCRATCH/layout.out")"
check "  ... one restart marker, naming the new layout" \
  test "$(grep -c "marker" "$SCRATCH/layout.out")" -eq 1 \
  -a -n "$(grep "^dump: run 1 'layout': marker 'resumed at step 10 on tp2 (was 1 rank)'" "$SCRATCH/layout.out")"
check "  ... the legend has the layout-change style" \
  grep -q "^dump: legend .*'restart, new layout'" "$SCRATCH/layout.out"

# Without events (an older file, or the events filtered out) the restart is found where the
# steps go back: 11..15 are logged again after 15, a restart after step 10.
grep -v '"event"' "$M" >"$SCRATCH/noevent.jsonl"
"$PLOT" "$SCRATCH/noevent.jsonl" --dump -o "$SCRATCH/noevent.png" >"$SCRATCH/noevent.out" 2>&1
check "no events: the restart at 10 (5 redone) is found from the steps" \
  grep -q "30 steps, 6 validation losses), restarts: step 10 (5 redone), skipped: none" \
  "$SCRATCH/noevent.out"
check "  ... and marked" grep -q "marker 'restart at step 10 (the steps went back), 5 redone'" \
  "$SCRATCH/noevent.out"

# --tensorboard: with no writer importable, exit 2 naming what to install and no PNG; with
# one (a stand-in tensorboardX that logs its calls, when torch's writer is not there), the
# final history's scalars, a directory per run.
if ! "$PYTHON_REF" -c "import torch.utils.tensorboard" 2>/dev/null; then
  if ! "$PYTHON_REF" -c "import tensorboardX" 2>/dev/null; then
    TSR_VENV=none "$PLOT" "$R" --tensorboard "$SCRATCH/tb" -o "$SCRATCH/no.png" >"$SCRATCH/tb.out" 2>&1
    rc=$?
    cat "$SCRATCH/tb.out"
    check "--tensorboard without a writer: exit 2, no PNG, names 'pip install tensorboard'" \
      test $rc -eq 2 -a ! -e "$SCRATCH/no.png" -a -n "$(grep "pip install tensorboard" "$SCRATCH/tb.out")"
  fi
  mkdir -p "$SCRATCH/py"
  cat >"$SCRATCH/py/tensorboardX.py" <<'EOF'
import os
class SummaryWriter:
    def __init__(self, d):
        os.makedirs(d, exist_ok=True)
        self.f = open(os.path.join(d, "calls.txt"), "w")
    def add_scalar(self, tag, value, step):
        self.f.write(f"scalar {tag} {step}\n")
    def add_text(self, tag, text, step):
        self.f.write(f"text {tag} {step} {text}\n")
    def close(self):
        self.f.close()
EOF
  PYTHONPATH="$SCRATCH/py" "$PLOT" "$R" "$SCRATCH/b_dir" --tensorboard "$SCRATCH/tb" \
    -o "$SCRATCH/tb.png" >"$SCRATCH/tb.out" 2>&1
  rc=$?
  cat "$SCRATCH/tb.out"
  check "--tensorboard (stand-in writer): a directory per run, every step's loss once" \
    test $rc -eq 0 -a "$(grep -c "^scalar train/loss " "$SCRATCH/tb/run/calls.txt")" -eq 30 \
    -a "$(grep -c "^scalar train/loss " "$SCRATCH/tb/beta/calls.txt")" -eq 10 \
    -a "$(grep -c "^scalar val/loss " "$SCRATCH/tb/run/calls.txt")" -eq 6
  check "  ... the restart as text" grep -q "^text restarts 10 resumed at step 10" "$SCRATCH/tb/run/calls.txt"
fi

# Several validation sets ("val_losses" beside the weighted total val_loss): each set's
# loss is a line of its own, named in the legend.
"$PYTHON_REF" - "$SCRATCH/sets.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in range(1, 5):
        f.write(json.dumps({"step": s, "loss": 5.0 - 0.1 * s, "lr": 1e-3, "grad_norm": 1.0,
                            "samples": {"web": 6 * s, "code": 2 * s}}) + "\n")
        if s % 2 == 0:
            f.write(json.dumps({"step": s, "val_loss": 4.5 - 0.1 * s,
                                "val_losses": {"web": 4.6 - 0.1 * s, "code": 4.2 - 0.1 * s}}) + "\n")
PY
"$PLOT" "$SCRATCH/sets.jsonl" --dump -o "$SCRATCH/sets.png" >"$SCRATCH/sets.out" 2>&1
check "several validation sets: a line per set beside the total"   test $? -eq 0 -a -n "$(grep "^dump: run 1 .*: line val_loss: 2 points, steps 2-4" "$SCRATCH/sets.out")"   -a -n "$(grep "^dump: run 1 .*: line val_loss:web: 2 points, steps 2-4" "$SCRATCH/sets.out")"   -a -n "$(grep "^dump: run 1 .*: line val_loss:code: 2 points, steps 2-4" "$SCRATCH/sets.out")"
check "  ... named in the legend" grep -q "^dump: legend .*'validation web', 'validation code'" \
  "$SCRATCH/sets.out"

# --tensorboard with TensorBoard itself (tools/requirements.txt: the project's .venv, where
# tsr-plot runs itself when $PYTHON_REF has no writer), read back with TensorBoard's
# EventAccumulator: each run's train/loss and val/loss series are metrics.jsonl's final
# history (the later line of a redone step), step for step, as float32.
TBPY=
for py in "$top_srcdir/.venv/bin/python" "$PYTHON_REF"; do
  "$py" -c "import tensorboard.backend.event_processing.event_accumulator, torch.utils.tensorboard" \
    2>/dev/null && { TBPY=$py; break; }
done
if [ -z "$TBPY" ]; then
  echo "SKIP: --tensorboard read back: neither $top_srcdir/.venv nor $PYTHON_REF has tensorboard (tools/install-deps.sh)"
else
  rm -rf "$SCRATCH/tbr"
  "$PLOT" "$R" "$SCRATCH/b_dir" --tensorboard "$SCRATCH/tbr" -o "$SCRATCH/tbr.png" \
    >"$SCRATCH/tbr.out" 2>&1
  rc=$?
  cat "$SCRATCH/tbr.out"
  check "--tensorboard with TensorBoard ($TBPY): exit $rc, event files for both runs" \
    sh -c "test $rc -eq 0 && ls '$SCRATCH'/tbr/run/events.out.tfevents.* '$SCRATCH'/tbr/beta/events.out.tfevents.* >/dev/null"
  "$TBPY" - "$SCRATCH/tbr" "$M" "$SCRATCH/b_dir/metrics.jsonl" <<'PY'
import json, sys
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
top, files = sys.argv[1], {"run": sys.argv[2], "beta": sys.argv[3]}
ok = True
for name, path in files.items():
    want = {"train/loss": {}, "val/loss": {}}
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        if "loss" in r:
            want["train/loss"][r["step"]] = r["loss"]  # the later line of a redone step
        if "val_loss" in r:
            want["val/loss"][r["step"]] = r["val_loss"]
    ea = EventAccumulator(f"{top}/{name}")
    ea.Reload()
    for tag, w in want.items():
        got = [(e.step, e.value) for e in ea.Scalars(tag)]
        exp = [(s, float(np.float32(v))) for s, v in sorted(w.items())]
        same = got == exp
        ok &= same and len(exp) > 0
        print(f"    {name} {tag}: {len(got)} points from TensorBoard, {len(exp)} in metrics.jsonl,"
              f" {'equal' if same else 'DIFFERENT'}; first {got[:2]}")
sys.exit(0 if ok else 1)
PY
  check "  ... TensorBoard's EventAccumulator reads back each run's loss series as in metrics.jsonl" \
    test $? -eq 0
fi

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
