#!/usr/bin/env bash
# ckpt_auto.sh — checkpoint.every_steps = 'auto', the Young-Daly interval
# (src/ckpt/ckpt_interval.c, src/run/session_ckpt.c), on the tiny llama of ckpt_async.sh, 2 ranks:
#  (a) the deck: 'auto' without checkpoint.mtbf_hours > 0 stops the run before it starts,
#      exit 2, naming the key where it was set (file:line:col or the command-line argument).
#  (b) a fixed cost: with TSR_FAULT ckpt_cost=0.5,ckpt_step_time=1 (C = 0.5 s, a step 1 s)
#      and mtbf_hours = 0.01 the checkpoints of a 20-step run come at the steps the formula
#      gives: the first 3 steps in, then every max(1, round(sqrt(2 C MTBF) / t)) steps,
#      and the last step; each decision's logged goodput is 1 - C/T - T/(2 MTBF).
#  (c) measured costs, asynchronous and synchronous writes: every logged decision follows
#      the formula from the C, step time, MTBF and background write it logs
#      (max(1, round(sqrt(2 C MTBF) / t), ceil(write / t))), and the next checkpoint is
#      taken at the step it announced.
#  (e) a background writer that slows the steps it overlaps (TSR_FAULT ckpt_overlap_s=0.5
#      counts each such step 0.5 s longer; ckpt_sleep=0.05 makes each write last long
#      enough to overlap steps): the decision after the first write counts that time in C
#      ("(X s of it the steps the last background write slowed)", X >= 0.45: the injected
#      0.5 s less the noise of the steps' own times; C >= X), and
#      its step time is that of the steps no write overlapped (< 0.5 s), and the decisions
#      still follow the formula from what they log.
#  (d) tessera plan for the same job: the file is 12 bytes per parameter, written in
#      bytes / hardware.fs_gbps; the Young-Daly interval from that write time and the planned
#      step time, with its goodput, as the formula gives; the host snapshot per GPU equals
#      what the trainer of (c) logged for its ranks; without mtbf_hours the text says to set
#      it.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers
C=(model.vocab_size=256 model.n_layer=4 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.log_every=1000
  run.eval_every=0 optim.warmup_steps=2 optim.decay_steps=20 parallel.zero_stage=1
  "data.train=$SCRATCH/data/train_*.bin" checkpoint.keep=2 checkpoint.resume=none)
decisions() { # decisions RUN MAX_STEPS [C STEP_S MTBF_H]: the logged decisions against the formula
  "$PYTHON_REF" - "$SCRATCH/$1.out" "$SCRATCH/$1/metrics.jsonl" "${@:2}" <<'PY'
import json, math, re, sys
out, metrics, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
fixed = [float(x) for x in sys.argv[4:7]]
pat = re.compile(r"checkpoint: 'auto' interval (\d+) steps, next at step (\d+): C (\S+) s"
                 r"(?: \(\S+ s of it the steps the last background write slowed\))?, step time "
                 r"(\S+) s, MTBF (\S+) h, sqrt\(2 C MTBF\) = (\S+) s(?:, at least (\d+) step\(s\) for a "
                 r"background write of (\S+) s)?; expected goodput (\S+) \(1 - C/T - T/\(2 MTBF\), T = (\S+) s\)")
lines = [m for m in map(pat.search, open(out)) if m]
ckpts = [r["step"] for r in map(json.loads, open(metrics)) if r.get("event") == "checkpoint"]
bad = []
for m in lines:
    steps, nxt, c, t, mtbf_h, period = int(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5]), float(m[6])
    floor, write, goodput, T = int(m[7] or 0), float(m[8] or 0), float(m[9]), float(m[10])
    if fixed and (c, t, mtbf_h) != tuple(fixed):
        bad.append(f"C, t, MTBF {c, t, mtbf_h} are not {tuple(fixed)}")
    M = mtbf_h * 3600
    yd = math.sqrt(2 * c * M)
    ratio = yd / t
    want = max(1, round(ratio), math.ceil(write / t) if write > 0 else 0)
    # printed to 6 digits: a ratio within 1e-4 of k + 1/2 may round either way
    near_half = abs(ratio - math.floor(ratio) - 0.5) < 1e-4
    if steps != want and not (near_half and abs(steps - want) == 1 and floor < steps):
        bad.append(f"interval {steps} != max(1, round({yd:.6g} / {t}), ceil({write} / {t})) = {want}")
    if write > 0 and floor != math.ceil(write / t) and abs(write / t - round(write / t)) > 1e-4:
        bad.append(f"floor {floor} != ceil({write} / {t})")
    if abs(period - yd) > 1e-5 * yd + 1e-9:
        bad.append(f"sqrt(2 C MTBF) {period} != {yd:.6g}")
    g = max(0.0, min(1.0, 1 - c / (steps * t) - steps * t / (2 * M)))
    if abs(goodput - g) > 6e-5 or abs(T - steps * t) > 1e-5 * T:
        bad.append(f"goodput {goodput} != {g:.5f} at T = {steps * t:.6g}")
    at = nxt - steps
    if at not in ckpts:
        bad.append(f"a decision for step {at}, which has no checkpoint record")
    later = [s for s in ckpts if s > at]
    if later and later[0] != min(nxt, max_steps):
        bad.append(f"after step {at} the next checkpoint is {later[0]}, announced {nxt}")
print(f"    checkpoints at {ckpts}; {len(lines)} decisions, {len(bad)} wrong")
for b in bad[:5]:
    print("    " + b)
sys.exit(0 if lines and not bad and ckpts and ckpts[0] == 3 and ckpts[-1] == max_steps else 1)
PY
}

# ---- (a) the deck ----
launch -t 60 -l nomtbf checkpoint.every_steps=auto run.out_dir="$SCRATCH/nomtbf"
check "(a) every_steps=auto without mtbf_hours: exit 2 (got $?)" test $? -eq 2
n=$((${#C[@]} + 1)) # its place among the overrides
check "(a)   ... at the argument that set it" \
  grep -q "^<command line>:arg$n:1: checkpoint.every_steps = 'auto' needs checkpoint.mtbf_hours > 0" \
  "$SCRATCH/nomtbf.out"
check "(a)   ... and nothing trained" test ! -e "$SCRATCH/nomtbf/metrics.jsonl"
printf "&checkpoint\n  every_steps = 'auto'\n  mtbf_hours  = 0\n/\n" >"$SCRATCH/zero.nml"
timeout 60 "$TESSERA" "$SCRATCH/zero.nml" run.out_dir="$SCRATCH/zero" >"$SCRATCH/zero.out" 2>&1
rc=$?
check "(a) mtbf_hours = 0 in a deck: exit 2 (got $rc), at its line and column" \
  test $rc -eq 2 && grep -q "^$SCRATCH/zero.nml:3:3: checkpoint.every_steps = 'auto' needs checkpoint.mtbf_hours > 0" \
  "$SCRATCH/zero.out"

# ---- (b) a fixed cost and step time ----
TSR_FAULT=ckpt_cost=0.5,ckpt_step_time=1 launch -n 2 -o fixed run.max_steps=20 checkpoint.every_steps=auto \
  checkpoint.mtbf_hours=0.01
check "(b) C = 0.5 s, t = 1 s, MTBF 0.01 h, 20 steps (exit $?)" test $? -eq 0
want=$("$PYTHON_REF" -c "
import math
n = max(1, round(math.sqrt(2 * 0.5 * 0.01 * 3600) / 1))
s = list(range(3, 20, n)) + [20]
print(' '.join(map(str, s)))")
got=$("$PYTHON_REF" -c "
import json, sys
print(' '.join(str(r['step']) for r in map(json.loads, open(sys.argv[1])) if r.get('event') == 'checkpoint'))" \
  "$SCRATCH/fixed/metrics.jsonl")
echo "    checkpoints at $got, the formula says $want"
check "(b)   ... the checkpoints come at the formula's steps" test "$got" = "$want"
check "(b)   ... every decision logs C, t, MTBF, sqrt(2 C MTBF) and the goodput of its interval" \
  decisions fixed 20 0.5 1 0.01

# ---- (c) measured costs ----
# a synchronous write costs more than the snapshot: a shorter MTBF keeps the interval short
for mode in "async T 1e-5" "sync F 2e-6"; do
  set -- $mode
  launch -n 2 -o "measured_$1" run.max_steps=50 checkpoint.every_steps=auto checkpoint.mtbf_hours=$3 \
    checkpoint.async=$2
  check "(c) $1 writes, MTBF $3 h, 50 steps (exit $?)" test $? -eq 0
  check "(c)   ... each decision follows the formula from what it logs, and is kept" \
    decisions "measured_$1" 50
done

# ---- (e) a writer that slows the steps it overlaps ----
TSR_FAULT=ckpt_overlap_s=0.5,ckpt_sleep=0.05 launch -n 2 -o overlap run.max_steps=40 \
  checkpoint.every_steps=auto checkpoint.mtbf_hours=2e-5 checkpoint.async=.true.
check "(e) async writes that slow the steps they overlap, 40 steps (exit $?)" test $? -eq 0
check "(e)   ... C counts the slowed steps, t leaves them out" "$PYTHON_REF" - "$SCRATCH/overlap.out" <<'PY'
import re, sys
pat = re.compile(r"'auto' interval \d+ steps, next at step \d+: C (\S+) s \((\S+) s of it the steps the "
                 r"last background write slowed\), step time (\S+) s")
found = [tuple(map(float, m.groups())) for m in map(pat.search, open(sys.argv[1])) if m]
print(f"    (C, slowed, t) of the decisions after a write: {found}")
# X is 0.5 s per overlapped step plus those steps' own time less the other steps' mean:
# a few ms either way (0.497 seen on one step), so 0.45 of the injected 0.5 s per step
sys.exit(0 if found and all(x >= 0.45 and c >= x and t < 0.5 for c, x, t in found) else 1)
PY
check "(e)   ... and each decision follows the formula from what it logs" decisions overlap 40

# ---- (d) tessera plan ----
P=("$TESSERA" plan /dev/null --gpus-per-node 2 "${C[@]}")
"${P[@]}" checkpoint.mtbf_hours=0.5 --json >"$SCRATCH/plan.json" 2>"$SCRATCH/plan.err" &&
  "${P[@]}" checkpoint.mtbf_hours=0.5 hardware.fs_gbps=0.25 --json >"$SCRATCH/plan_slow.json" &&
  "${P[@]}" checkpoint.mtbf_hours=0.5 >"$SCRATCH/plan.txt" && "${P[@]}" >"$SCRATCH/plan_none.txt"
check "(d) tessera plan with and without mtbf_hours (exit $?)" test $? -eq 0
logged=$(sed -n 's/.*a host snapshot of \([0-9.]*\) MB on this rank.*/\1/p' "$SCRATCH/measured_async.out")
check "(d)   ... its checkpoint figures follow from the plan's own" \
  "$PYTHON_REF" - "$SCRATCH/plan.json" "$SCRATCH/plan_slow.json" "${logged:-nan}" <<'PY'
import json, math, sys
p, slow = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
c, yd = p["checkpoint"], p["checkpoint"]["young_daly"]
M, t = 0.5 * 3600, p["time"]["step_s"]
steps = max(1, round(math.sqrt(2 * c["write_s"] * M) / t))
goodput = 1 - c["write_s"] / (steps * t) - steps * t / (2 * M)
rel = lambda a, b: abs(a - b) <= 1e-5 * abs(b)
ok = [c["bytes"] == 12 * p["model"]["n_params"],
      rel(c["write_s"], c["bytes"] / (c["fs_gbps"] * 1e9)),
      rel(slow["checkpoint"]["write_s"], c["bytes"] / 0.25e9),
      # the JSON's 6 digits of a tiny step time leave the last of many steps uncertain
      yd["cost_s"] == c["write_s"] and rel(yd["step_s"], t) and abs(yd["steps"] - steps) <= 1e-5 * steps,
      abs(yd["goodput"] - goodput) < 1e-5,
      abs(c["snapshot_bytes"] / 1e6 - float(sys.argv[3])) <= 0.0005]
print(f"    {c['bytes']} bytes in {c['write_s']:.4g} s; every {yd['steps']} steps of {t:.4g} s "
      f"(formula {steps}), goodput {yd['goodput']:.5f}; snapshot {c['snapshot_bytes'] / 1e6:.3f} MB, "
      f"the trainer logged {sys.argv[3]} MB; {ok}")
sys.exit(0 if all(ok) else 1)
PY
check "(d)   ... the text gives the interval, and asks for mtbf_hours without it" \
  sh -c "grep -q '^  Young-Daly  .*sqrt(2 C MTBF)' '$SCRATCH/plan.txt' && grep -q 'host snapshot' '$SCRATCH/plan.txt' && grep -q 'set checkpoint.mtbf_hours for the Young-Daly interval' '$SCRATCH/plan_none.txt'"
finish
