#!/usr/bin/env bash
# mixture.sh — a weighted mixture of two datasets (&data train, weights, names) and two
# validation sets, byte-level shards of two fortune files ('web' and 'code'), weights 2 : 1
# (normalised to 2/3 and 1/3), shuffled, 12 steps of 8 samples:
#  - the log names each dataset with its tokens, weight and the epochs the run takes;
#  - metrics.jsonl counts the samples of each dataset at every step, each within one
#    sample of its share (so within 1% over the run: 64 and 32 of 96);
#  - evaluations report val_losses per set and val_loss, their weighted total (2 : 1);
#    tessera eval of the last checkpoint repeats them (eval.jsonl);
#  - stopped at step 6 on one rank and resumed on two (dp 2, zero 1) to step 12: the same
#    sample counts at every step as the run that never stopped (exact), the same losses
#    within the layout tolerance (1e-5 relative, as tests/mpi/tp.sh);
#  - resumed with other weights: the log says a new blend starts, and the counts go on
#    from the checkpoint's;
#  - a single glob writes no per-dataset fields;
#  - bad decks, each exit 2 with file:line:col and the key: a negative weight, weights that
#    sum to 0, a glob that matches nothing, as many weights or names as globs.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
for f in computers science; do
  "$top_srcdir/tools/tsr-prepare" --out "$SCRATCH/data/$([ $f = computers ] && echo web || echo code)" \
    --tokenizer bytes "/usr/share/games/fortunes/$f" >/dev/null || { bad "tsr-prepare $f"; finish; }
done
D=$SCRATCH/data
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=2 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=32 train.micro_batch=2 train.global_batch=8 run.log_every=100
  run.eval_every=6 run.eval_steps=2 optim.lr=3e-3 optim.warmup_steps=2 optim.decay_steps=12
  data.shuffle=.true. checkpoint.every_steps=6
  "data.train='$D/web/train_*.bin', '$D/code/train_*.bin'" "data.weights=2, 1"
  "data.valid='$D/web/valid_*.bin', '$D/code/valid_*.bin'")

# metrics.jsonl of a run: per-dataset samples at every step within one sample of the
# weights' share, and val_loss the 2 : 1 weighted total of val_losses.
mixture_ok() {
  "$PYTHON_REF" - "$SCRATCH/$1/metrics.jsonl" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = {r["step"]: r for r in rows if "loss" in r}
w = {"web": 2 / 3, "code": 1 / 3}
ok = len(steps) == int(sys.argv[2])
for s, r in sorted(steps.items()):
    n = s * 8
    c = r.get("samples", {})
    if sorted(c) != sorted(w) or sum(c.values()) != n or any(abs(c[k] - w[k] * n) > 1 for k in w):
        print(f"    step {s}: samples {c} for {n}"); ok = False
last = steps[max(steps)]["samples"]
print(f"    {len(steps)} steps, samples at the end {last}: "
      f"shares {', '.join(f'{k} {v / sum(last.values()):.4f}' for k, v in last.items())}")
ok = ok and all(abs(last[k] / sum(last.values()) - w[k]) <= 0.01 * w[k] for k in w)
evals = [r for r in rows if "val_loss" in r]
for r in evals:
    v = r.get("val_losses", {})
    tot = sum(w[k] * v[k] for k in w) if sorted(v) == sorted(w) else None
    if tot is None or abs(tot - r["val_loss"]) > 1e-12 * abs(tot):
        print(f"    step {r['step']}: val_loss {r['val_loss']} is not the total of {v}"); ok = False
ok = ok and len(evals) == 2
sys.exit(0 if ok else 1)
PY
}

launch -o ref -t 180 run.max_steps=12
check "the mixture trains 12 steps (exit $?)" test -s "$SCRATCH/ref/metrics.jsonl"
check "the log gives each dataset's tokens, weight and epochs" \
  grep -qE "data: web +$D/web/train_\*.bin: 1 file\(s\), [0-9]+ tokens, [0-9]+ samples; weight 0.6667: 64 samples, [0-9.]+ epochs" "$SCRATCH/ref.out"
grep -E "^data: (web|code) " "$SCRATCH/ref.out" | sed 's/^/    /'
mixture_ok ref 12
check "samples per dataset within one sample of the weights at every step, val_loss the weighted total" test $? = 0
check "the log's val loss line names both sets" grep -qE "step +12 \| val loss [0-9.]+ \(web [0-9.]+, code [0-9.]+\)" "$SCRATCH/ref.out"

# Stop at step 6 on one rank, resume on two ranks (dp 2, zero 1).
launch -o split -t 180 run.max_steps=6
launch -n 2 -a -o split -t 180 run.max_steps=12 parallel.zero_stage=1
check "stopped at step 6 and resumed on dp 2 (zero 1)" grep -q "resumed from .*step_00000006.h5 at step 6" "$SCRATCH/split.out"
"$PYTHON_REF" - "$SCRATCH/ref/metrics.jsonl" "$SCRATCH/split/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
a, b = load(sys.argv[1]), load(sys.argv[2])
same = sorted(a) == sorted(b) and all(a[s]["samples"] == b[s]["samples"] for s in a)
worst = max(abs(a[s]["loss"] - b[s]["loss"]) / abs(a[s]["loss"]) for s in a)
print(f"    samples equal at every step: {same}; worst relative loss difference {worst:.1e}")
sys.exit(0 if same and worst <= 1e-5 else 1)
PY
check "the resumed run consumes the samples of the unstopped one, losses within 1e-5" test $? = 0
same_losses ref split 1e-5 >/dev/null
check "  ... and its validation losses within 1e-5" test $? = 0

# tessera eval of the last checkpoint: the training run's step-12 evaluation again.
timeout 120 "$TESSERA" eval /dev/null "${C[@]}" "run.out_dir=$SCRATCH/ref" >"$SCRATCH/eval.out" 2>&1
check "tessera eval on the mixture's validation sets runs" test -s "$SCRATCH/ref/eval.jsonl"
check "  ... and logs each set" grep -qE "eval .*: step 12 \| code: val loss [0-9.]+ over 2 batch" "$SCRATCH/eval.out"
"$PYTHON_REF" - "$SCRATCH/ref/metrics.jsonl" "$SCRATCH/ref/eval.jsonl" <<'PY'
import json, sys
train = [r for r in map(json.loads, open(sys.argv[1])) if r.get("step") == 12 and "val_loss" in r][0]
ev = [json.loads(l) for l in open(sys.argv[2])][-1]
print(f"    training {train['val_losses']}, eval {ev.get('val_losses')}")
ok = ev["step"] == 12 and sorted(ev["val_losses"]) == sorted(train["val_losses"]) and all(
    abs(ev["val_losses"][k] - v) <= 1e-9 * abs(v) for k, v in train["val_losses"].items())
sys.exit(0 if ok and abs(ev["val_loss"] - train["val_loss"]) <= 1e-9 * train["val_loss"] else 1)
PY
check "  ... eval.jsonl has val_loss and val_losses, the training run's at step 12" test $? = 0

# Resumed with other weights: a new blend from the checkpoint's counts.
mkdir -p "$SCRATCH/rew" && cp -r "$SCRATCH/split/ckpt" "$SCRATCH/rew/" &&
  rm -f "$SCRATCH"/rew/ckpt/step_00000012.h5 && echo step_00000006.h5 >"$SCRATCH/rew/ckpt/latest"
launch -o rew -a -t 180 run.max_steps=8 "data.weights=1, 1"
check "resumed with other weights: the log says a new blend starts at sample 48" \
  grep -q "is not the one checkpoint .* was written with (web: weight 0.6667 -> 0.5, at sample 32; code: weight 0.3333 -> 0.5, at sample 16): a new blend of the weights starts at sample 48" "$SCRATCH/rew.out"
check "  ... counts go on from the checkpoint's (step 8: web 40, code 24)" \
  test "$(metric "$SCRATCH/rew/metrics.jsonl" 8 samples)" = "{'web': 40, 'code': 24}"

# One glob: the records as before, without per-dataset fields.
launch -o one -t 120 run.max_steps=2 "data.train=$D/web/train_*.bin" data.weights=1 "data.valid=$D/web/valid_*.bin" \
  run.eval_every=2
check "a single glob writes no samples / val_losses fields" \
  "$PYTHON_REF" -c "import json, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; sys.exit(0 if len(rows) >= 3 and not any('samples' in r or 'val_losses' in r for r in rows) else 1)" \
  "$SCRATCH/one/metrics.jsonl"

# Bad decks: file:line:col naming the key, exit 2.
bad_deck() { # bad_deck WHAT PATTERN DECK-BODY-LINES...
  local what=$1 pattern=$2; shift 2
  printf '%s\n' '&data' "$@" '/' >"$SCRATCH/bad.nml"
  timeout 60 "$TESSERA" "$SCRATCH/bad.nml" "${C[@]:0:14}" "run.out_dir=$SCRATCH/bad" >"$SCRATCH/bad.out" 2>&1
  local rc=$?
  check "$what: exit 2 (got $rc)" test $rc = 2
  check "  ... at file:line:col naming the key" grep -qE -- "$pattern" "$SCRATCH/bad.out" ||
    sed 's/^/    /' "$SCRATCH/bad.out"
}
TWO="  train = '$D/web/train_*.bin', '$D/code/train_*.bin'"
bad_deck "a negative weight" "bad.nml:3:18: &data weights value 2 = -1 is out of range: must be >= 0" \
  "$TWO" "  weights = 0.5, -1"
bad_deck "weights summing to 0" "bad.nml:3:3: data.weights sum to 0" "$TWO" "  weights = 0, 0"
bad_deck "a glob that matches nothing" \
  "bad.nml:2:[0-9]+: data.train value 2 \(dataset 'nothing'\): no files match the data glob '$D/nothing/train_\*.bin'" \
  "  train = '$D/web/train_*.bin', '$D/nothing/train_*.bin'"
bad_deck "three weights for two globs" "bad.nml:3:3: data.train has 2 values but data.weights has 3" \
  "$TWO" "  weights = 1, 1, 1"
bad_deck "one name for two globs" "bad.nml:3:3: data.train has 2 values but data.names has 1" \
  "$TWO" "  names = 'web'"
finish
