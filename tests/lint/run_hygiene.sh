#!/usr/bin/env bash
# run_hygiene.sh — what a user expects around a training run:
#  - tessera.log lines and metrics.jsonl records carry ISO 8601 UTC times; the log starts
#    with the version, host and command line; the model line gives the whole model's
#    parameter count, and on tp 2 this rank's part beside it;
#  - tessera eval writes eval.jsonl, not the training run's metrics.jsonl;
#  - a resume with nothing left to train writes no metrics record;
#  - a resume under another schedule (run.max_steps) warns with the old and new values;
#  - a checkpoint of another model is refused naming the key (exit 2);
#  - train and valid shards of different tokenizers, and a checkpoint trained on another
#    tokenizer than the deck's data, are refused (exit 2);
#  - SIGINT stops like SIGTERM (checkpoint, a line saying so, exit 3); a second SIGINT
#    stops at once;
#  - metrics.jsonl's step_skipped marks the skipped step, skipped counts them.
. "$(dirname "$0")/../lib.sh"
mpi_test_setup
bytes_corpus art computers
D="$SCRATCH/data"
# a second byte corpus whose header names another tokenizer would need tsr-prepare to lie;
# the SentencePiece corpus of the demo names 'spm:fortunes'
corpus
T=(run.max_steps=4 run.log_every=1 "data.train=$D/train_*.bin" "data.valid=$D/valid_*.bin"
  model.vocab_size=2048 run.eval_every=2 run.eval_steps=2 train.micro_batch=4 train.global_batch=4
  model.seq_len=64)
run() { "$TESSERA" "$top_srcdir/input/tiny.nml" "${T[@]}" "$@"; }
# in the background, $! being the trainer itself (not a subshell), output to file $1
run_bg() {
  local out=$1
  shift
  "$TESSERA" "$top_srcdir/input/tiny.nml" "${T[@]}" "$@" >"$out" 2>&1 &
}
# reap PID, killing it after SECS seconds if it has not exited by then (a failed check)
reap() {
  local pid=$1 secs=$2
  (sleep "$secs" && kill -9 "$pid") 2>/dev/null &
  local guard=$!
  wait "$pid"
  local rc=$?
  kill "$guard" 2>/dev/null
  return $rc
}

A="$SCRATCH/a"
run run.out_dir="$A" "run.name='it''s'" >"$SCRATCH/a.out" 2>&1
check "a 4-step run exits 0" test $? -eq 0
ISO='[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z'
check "every tessera.log line that starts a message starts with an ISO time" \
  test "$(grep -cE "^$ISO (step|model|data|checkpoint|done)" "$A/tessera.log")" -ge 8
check "the log names the version and host" \
  grep -qE "^$ISO tessera [0-9.]+ started $ISO on $(hostname | sed 's/[.]/[.]/g')" "$A/tessera.log"
check "the log has the command line, quoting the glob" \
  grep -qF "command: $TESSERA $top_srcdir/input/tiny.nml run.max_steps=4 run.log_every=1 'data.train=$D/train_*.bin'" "$A/tessera.log"
# the logged command line, read back by a shell, gives the same arguments
logged=$(sed -n 's/^[^ ]* command: //p' "$A/tessera.log" | head -1)
eval "set -- $logged"
check "the logged command line reads back as the same arguments, quotes included" \
  test "$#" -eq $((${#T[@]} + 4)) -a "$3" = "${T[0]}" -a "${!#}" = "run.name='it''s'"
check "every metrics.jsonl record has a time" "$PYTHON_REF" -c '
import json, re, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) >= 6, rows
for r in rows:
    datetime.datetime.strptime(r["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
' "$A/metrics.jsonl"
NP=$("$PYTHON_REF" - <<'PY'
V, C, L, F, KV = 2048, 128, 4, 384, 64   # tiny.nml: llama, 4 layers, d_ff 384, 2 of 4 heads KV
per_layer = 2 * C + 2 * C * C + 2 * C * KV + 3 * C * F   # two norms, q o, k v, the MLP
print(V * C + L * per_layer + C + V * C)    # embedding, layers, final norm, LM head
PY
)
check "the model line gives the whole model's $NP parameters" \
  grep -qE "^model: llama, $NP parameters" "$SCRATCH/a.out"

"$MPIRUN" -np 2 "$TESSERA" "$top_srcdir/input/tiny.nml" "${T[@]}" parallel.tp=2 \
  run.max_steps=1 run.out_dir="$SCRATCH/tp" >"$SCRATCH/tp.out" 2>&1
check "on tp 2 the model line gives the whole count and this rank's part" \
  grep -qE "^model: llama, $NP parameters \([0-9.]+ M\); this rank's part \(stage 0 of 1, tp rank 0 of 2\): [0-9]+" "$SCRATCH/tp.out"

TSR_FAULT=nan_grad_step=2 run run.out_dir="$SCRATCH/nan" run.max_steps=3 >"$SCRATCH/nan.out" 2>&1
check "a run with a non-finite gradient at step 2 exits 0" test $? -eq 0
check "step_skipped marks that step alone; skipped counts" "$PYTHON_REF" -c '
import json, sys
r = {x["step"]: x for x in map(json.loads, open(sys.argv[1])) if "loss" in x}
assert [r[s]["step_skipped"] for s in (1, 2, 3)] == [0, 1, 0], r
assert [r[s]["skipped"] for s in (1, 2, 3)] == [0, 1, 1], r
' "$SCRATCH/nan/metrics.jsonl"

lines() { wc -l <"$A/metrics.jsonl"; }
n0=$(lines)
"$TESSERA" eval "$top_srcdir/input/tiny.nml" "${T[@]}" run.out_dir="$A" >"$SCRATCH/eval.out" 2>&1
check "tessera eval exits 0" test $? -eq 0
check "eval writes eval.jsonl with the step, time and val_loss" "$PYTHON_REF" -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 1 and r[0]["step"] == 4 and "val_loss" in r[0] and "time" in r[0], r
' "$A/eval.jsonl"
check "eval leaves metrics.jsonl alone" test "$(lines)" = "$n0"

run run.out_dir="$A" >"$SCRATCH/noop.out" 2>&1
check "a resume at run.max_steps exits 0" test $? -eq 0
check "... says there is nothing to train" grep -q "run.max_steps = 4 is reached, nothing to train" "$SCRATCH/noop.out"
check "... and writes no metrics record" test "$(lines)" = "$n0"

run run.out_dir="$A" run.max_steps=6 >"$SCRATCH/longer.out" 2>&1
check "a resume to run.max_steps = 6 exits 0" test $? -eq 0
check "... warns that the schedule changed, with both values" \
  grep -q "warning: resuming at step 4 with another learning-rate schedule: run.max_steps: checkpoint 4, deck 6" "$SCRATCH/longer.out"
check "... and says how to keep the old decay" grep -q "set optim.decay_steps = 4" "$SCRATCH/longer.out"
check "... and logs one resume event" test "$(grep -c '"event":"resume"' "$A/metrics.jsonl")" = 1

run run.out_dir="$A" run.max_steps=8 model.d_ff=352 >"$SCRATCH/dff.out" 2>&1
check "a deck of another model exits 2" test $? -eq 2
check "... naming the key and both values" \
  grep -q "error: checkpoint .*step_00000006.h5 was written for another model: model.d_ff: checkpoint 384, deck 352" "$SCRATCH/dff.out"
check "... without a list of tensor shapes" test "$(grep -c 'shape' "$SCRATCH/dff.out")" = 0

run run.out_dir="$SCRATCH/mixed" "data.valid=$CORPUS/valid_*.bin" >"$SCRATCH/mixed.out" 2>&1
check "train and valid shards of different tokenizers exit 2" test $? -eq 2
check "... naming both tokenizers" \
  grep -q "were made with tokenizer 'bytes' but the valid shards .* with 'spm:fortunes'" "$SCRATCH/mixed.out"
run run.out_dir="$A" run.max_steps=8 "data.train=$CORPUS/train_*.bin" \
  "data.valid=$CORPUS/valid_*.bin" >"$SCRATCH/tok.out" 2>&1
check "a checkpoint trained on another tokenizer exits 2" test $? -eq 2
check "... naming both" \
  grep -q "was trained on tokens of tokenizer 'bytes', but the deck's data was made with 'spm:fortunes'" "$SCRATCH/tok.out"

# SIGINT: the first stops at the next step boundary with a checkpoint, the second at once
S="$SCRATCH/int"
run_bg "$SCRATCH/int.out" run.out_dir="$S" run.max_steps=100000 run.eval_every=0
pid=$!
for _ in $(seq 600); do grep -q '"loss"' "$S/metrics.jsonl" 2>/dev/null && break; sleep 0.2; done
kill -INT $pid
reap $pid 120
check "SIGINT stops the run with exit 3" test $? -eq 3
check "... saying so" grep -q "signal 2 received: writing a checkpoint at step [0-9]* and stopping" "$SCRATCH/int.out"
check "... and that it stopped cleanly" grep -q "stopped cleanly at step [0-9]* with its checkpoint written: exit 3" "$SCRATCH/int.out"
check "... after writing a checkpoint" test -e "$S/ckpt/latest"
# the second SIGINT while the first one's checkpoint is being written (held 20 s open)
S2="$SCRATCH/int2"
TSR_FAULT="ckpt_sleep=20,ckpt_where=start" run_bg "$SCRATCH/int2.out" run.out_dir="$S2" \
  run.max_steps=100000 run.eval_every=0 checkpoint.every_steps=0
pid=$!
for _ in $(seq 600); do grep -q '"loss"' "$S2/metrics.jsonl" 2>/dev/null && break; sleep 0.2; done
kill -INT $pid
for _ in $(seq 600); do grep -q 'fault injection: sleeping' "$SCRATCH/int2.out" && break; sleep 0.1; done
t0=$(date +%s)
kill -INT $pid
reap $pid 60
rc=$?
check "a second SIGINT stops at once (killed by SIGINT: 130, got $rc)" test $rc -eq 130
check "... within seconds, not after the 20 s write" test $(($(date +%s) - t0)) -le 5
check "... saying so" grep -q "second interrupt: stopping now, without a checkpoint" "$SCRATCH/int2.out"
check "... and publishes no checkpoint" test ! -e "$S2/ckpt/latest"
finish
