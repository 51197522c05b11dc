#!/usr/bin/env bash
# readme_example.sh — README.md's "Train on your own text" example, run as written: the
# fenced block after the "readme-example: own-data" comment, in a scratch directory that
# holds a small text under the name the example uses and links to the tree's tools/,
# input/ and the built src/.  The only change is a smaller run.max_steps (the example sets
# it, so the value is swapped; the test fails if the example stops setting it).  Checks
# that the commands succeed, that the one input file was cut into paragraphs with a
# validation split, and that the run wrote a checkpoint of the last step and a finite
# validation loss below the first step's training loss, which tessera eval then repeats.
# Then the "Several datasets" block (the "readme-example: mixture" comment) in the same
# directory, on a second text of its own name, with a smaller run.max_steps too: it runs,
# the log lists both datasets, metrics.jsonl counts the samples of each at the weights
# (within 1%), and the last evaluation's val_losses per set (val_loss their weighted
# total) are what tessera eval gives again.
# Exit 0 pass, 1 fail, 77 skip (no trainer, spm_train or fortunes).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
[ -x "$TESSERA" ] || skip "no $TESSERA (run make first)"
command -v spm_train >/dev/null || skip "spm_train not installed (apt-get install sentencepiece)"
fortunes=/usr/share/games/fortunes
for f in fortunes computers science people; do
  [ -f "$fortunes/$f" ] || skip "$fortunes/$f not found (apt-get install fortunes)"
done
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
scratch
STEPS=20

# The block: from the marker comment to the end of the first fenced block after it.
awk '/<!-- readme-example: own-data/ { on = 1; next }
     on && /^```/ { if (inside) exit; inside = 1; next }
     inside { print }' "$top_srcdir/README.md" >"$SCRATCH/example.sh"
cat "$SCRATCH/example.sh"
check "README.md has the own-data example (tsr-prepare, then tessera)" \
  grep -q "^tools/tsr-prepare .*--out" "$SCRATCH/example.sh"
grep -q "^src/tessera input/" "$SCRATCH/example.sh" || bad "the example does not run src/tessera"
n=$(grep -o 'run\.max_steps=[0-9]*' "$SCRATCH/example.sh" | wc -l)
check "the example sets run.max_steps once ($n), so a test can shorten it" test "$n" = 1
sed -i "s/run\.max_steps=[0-9]*/run.max_steps=$STEPS/" "$SCRATCH/example.sh"
[ "$TESTS_FAILED" -eq 0 ] || finish

# The input: the text file the example names, about 400 KB of prose paragraphs (fortune
# entries with a blank line between them, no '%' lines).
text=$(grep -o '[A-Za-z0-9_.-]*\.txt' "$SCRATCH/example.sh" | head -n 1)
check "the example names its text file ($text)" test -n "$text"
cat "$fortunes/fortunes" "$fortunes/computers" "$fortunes/science" |
  awk '/^%$/ { print ""; next } { print }' >"$SCRATCH/$text"
ln -s "$(cd "$top_srcdir" && pwd)/tools" "$SCRATCH/tools"
ln -s "$(cd "$top_srcdir" && pwd)/input" "$SCRATCH/input"
mkdir "$SCRATCH/src"
ln -s "$(cd "$(dirname "$TESSERA")" && pwd)/tessera" "$SCRATCH/src/tessera"

(cd "$SCRATCH" && bash -eu example.sh) >"$SCRATCH/run.txt" 2>&1
rc=$?
grep -E "tsr-prepare|step +$STEPS|val loss|eval |error" "$SCRATCH/run.txt" | sed 's/^/    /'
check "the example runs as written (max_steps $STEPS): exit 0 (got $rc)" test $rc = 0
check "tsr-prepare cut the one file into paragraphs, with a validation split" \
  grep -q "split by paragraphs" "$SCRATCH/run.txt"
ck=$(find "$SCRATCH/out" -path "*/ckpt/step_$(printf %08d $STEPS).h5" 2>/dev/null | head -n 1)
check "the run wrote the checkpoint of step $STEPS (${ck#"$SCRATCH"/})" test -n "$ck"
metrics=$(find "$SCRATCH/out" -name metrics.jsonl 2>/dev/null | head -n 1)
check "the run wrote metrics.jsonl" test -n "$metrics"
if [ -n "$metrics" ]; then
  "$PYTHON_REF" - "$metrics" "$(dirname "$metrics")/eval.jsonl" "$STEPS" <<'PY'
import json, math, os, sys
def rows(path):
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
train, evals, steps = rows(sys.argv[1]), rows(sys.argv[2]), int(sys.argv[3])
first = min((r for r in train if "loss" in r), key=lambda r: r["step"])["loss"]
vals = [r["val_loss"] for r in train + evals if "val_loss" in r and r["step"] == steps]
print(f"    step 1 loss {first:.4f}; validation loss at step {steps} "
      f"(the run's, then tessera eval's): {vals}")
ok = (len(vals) == 2 and all(math.isfinite(v) and v < first for v in vals)
      and abs(vals[0] - vals[1]) <= 1e-6 * abs(vals[1]))
sys.exit(0 if ok else 1)
PY
  check "a finite validation loss below the first training loss, the same from tessera eval" \
    test $? = 0
fi

# The mixture block, after the first (it encodes its text with the first one's model).
awk '/<!-- readme-example: mixture/ { on = 1; next }
     on && /^```/ { if (inside) exit; inside = 1; next }
     inside { print }' "$top_srcdir/README.md" >"$SCRATCH/mixture.sh"
cat "$SCRATCH/mixture.sh"
n=$(grep -o 'run\.max_steps=[0-9]*' "$SCRATCH/mixture.sh" | wc -l)
check "README.md has the mixture example, setting run.max_steps once ($n)" test "$n" = 1
sed -i "s/run\.max_steps=[0-9]*/run.max_steps=$STEPS/" "$SCRATCH/mixture.sh"
notes=$(grep -o '[A-Za-z0-9_.-]*\.txt' "$SCRATCH/mixture.sh" | head -n 1)
check "the mixture example names its second text ($notes), not the first's" \
  test -n "$notes" -a "$notes" != "$text"
awk '/^%$/ { print ""; next } { print }' "$fortunes/people" >"$SCRATCH/$notes"
(cd "$SCRATCH" && bash -eu mixture.sh) >"$SCRATCH/mix.txt" 2>&1
rc=$?
grep -E "tsr-prepare|^data: |step +$STEPS|val loss|eval |error" "$SCRATCH/mix.txt" | sed 's/^/    /'
check "the mixture example runs as written (max_steps $STEPS): exit 0 (got $rc)" test $rc = 0
out=$(grep -o 'run\.out_dir=[^ ]*' "$SCRATCH/mixture.sh" | head -n 1 | cut -d= -f2)
check "the log lists the two datasets with their weights" \
  test "$(grep -cE "^data: [a-z]+ +.*weight 0\.(7|3)000: " "$SCRATCH/mix.txt")" = 2
"$PYTHON_REF" - "$SCRATCH/$out/metrics.jsonl" "$SCRATCH/$out/eval.jsonl" "$STEPS" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
evals = [json.loads(l) for l in open(sys.argv[2])] if os.path.exists(sys.argv[2]) else []
steps = int(sys.argv[3])
last = [r for r in rows if r.get("step") == steps and "samples" in r]
val = [r for r in rows if r.get("step") == steps and "val_losses" in r]
ok = len(last) == 1 and len(val) == 1 and len(evals) == 1
if ok:
    c, v, e = last[0]["samples"], val[0], evals[0]
    n = sum(c.values())
    share = sorted(x / n for x in c.values())
    print(f"    samples at step {steps}: {c}; val_losses {v['val_losses']}, eval {e.get('val_losses')}")
    ok = (len(c) == 2 and abs(share[0] - 0.3) <= 0.01 * 0.3 and abs(share[1] - 0.7) <= 0.01 * 0.7
          and sorted(v["val_losses"]) == sorted(c) and e.get("val_losses") is not None
          and all(abs(e["val_losses"][k] - x) <= 1e-6 * abs(x) for k, x in v["val_losses"].items())
          and abs(e["val_loss"] - v["val_loss"]) <= 1e-6 * abs(v["val_loss"]))
sys.exit(0 if ok else 1)
PY
check "samples per dataset at the weights (1%); val_losses per set, the same from tessera eval" \
  test $? = 0
finish
