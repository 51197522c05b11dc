#!/usr/bin/env bash
# bench/xent_head.sh — the LM head fused with the loss (train.xent_chunk_tokens) against
# the unfused head (0), on the CPU: ms per step with its forward and backward, the run's
# own memory line (op memory in use and at its peak after step 1), the activations it
# allocated and the process's peak RSS (/usr/bin/time -v), for input/gpt2_124m.nml (vocab
# 50304, tied head) shrunk to BATCH sequences of SEQ tokens per step on one rank.
#
#   bench/xent_head.sh [TESSERA] [STEPS] [ROUNDS]      (default src/tessera, 3, 1)
#
# Environment: CHUNKS (default "0 2048 1024 256": 0 is the unfused head, 2048 one chunk of
# the 2048 tokens), PRECISIONS (default "fp32 bf16"), BATCH (2), SEQ (1024), THREADS (all
# cores).  The first step is a warm-up; ms are the median over the others of a run, then
# the median over ROUNDS runs, the configurations taking turns in each round (a busy
# machine slows them alike), and "best" the fastest step of all rounds (the one least
# disturbed); memory is the first round's (it repeats).  The data are the
# fortunes corpus of the demo (tools/fortunes-corpus.sh), in file order; every run starts
# from the same seed, so the losses printed agree across chunk sizes (fp32 to ~1e-9).
# ZeRO is off (one rank).  The peak RSS includes the setup's fp32 initial copy of the
# parameters; "in use" is what a step holds.
set -euo pipefail
TESSERA=${1:-src/tessera}
STEPS=${2:-3}
ROUNDS=${3:-1}
CHUNKS=${CHUNKS:-"0 2048 1024 256"}
PRECISIONS=${PRECISIONS:-"fp32 bf16"}
BATCH=${BATCH:-2}
SEQ=${SEQ:-1024}
THREADS=${THREADS:-$(nproc)}
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}
here=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/tsr-bench-xent.XXXXXX)
trap 'rm -rf "$W"' EXIT

"$here/tools/fortunes-corpus.sh" "$W/data" 2048 >"$W/corpus.log" 2>&1 ||
  { cat "$W/corpus.log"; exit 1; }
echo "machine: $(nproc) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1);" \
  "threads $THREADS; gpt2_124m at $BATCH x $SEQ tokens per step, $STEPS steps (1 warm-up)" \
  "x $ROUNDS round(s)"
for r in $(seq 1 "$ROUNDS"); do
for p in $PRECISIONS; do
  for c in $CHUNKS; do
    out=$W/${p}_${c}_$r
    echo "round $r: $p, train.xent_chunk_tokens=$c" >&2
    OMP_NUM_THREADS=$THREADS /usr/bin/time -v "$TESSERA" "$here/input/gpt2_124m.nml" \
      "data.train=$W/data/train_*.bin" data.valid= data.shuffle=.false. train.precision="$p" \
      run.eval_every=0 run.max_steps="$STEPS" run.log_every=1 run.out_dir="$out" \
      checkpoint.resume=none checkpoint.every_steps=0 parallel.zero_stage=0 \
      train.micro_batch="$BATCH" train.global_batch="$BATCH" model.seq_len="$SEQ" \
      train.xent_chunk_tokens="$c" >"$out.log" 2>&1 || { tail -20 "$out.log"; exit 1; }
  done
done
done

"$PYTHON_REF" - "$W" "$PRECISIONS" "$CHUNKS" "$ROUNDS" <<'PY'
import json, re, statistics, sys
W, precs, chunks, rounds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4])
print("%-5s %6s %8s %8s %8s %8s %10s %10s %9s %9s %14s" % (
    "prec", "chunk", "ms/step", "best", "forward", "backward", "activ. MB", "in use MB",
    "peak MB", "RSS MB", "loss@last"))
for p in precs:
    for c in chunks:
        log = open(f"{W}/{p}_{c}_1.log").read()
        runs = []
        for r in range(1, rounds + 1):
            rows = [json.loads(l) for l in open(f"{W}/{p}_{c}_{r}/metrics.jsonl")]
            runs.append([r for r in rows if "loss" in r])
        rows = runs[0]
        med = lambda k: statistics.median(statistics.median(r[k] for r in run[1:]) for run in runs)
        act = float(re.search(r"activations ([0-9.]+) MB", log).group(1))
        use, peak = map(float, re.search(
            r"memory at step 1, most on any rank: in use ([0-9.]+) MB, peak ([0-9.]+) MB",
            log).groups())
        rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log).group(1)) / 1024
        best = min(r["step_ms"] for run in runs for r in run[1:])
        print("%-5s %6s %8.0f %8.0f %8.0f %8.0f %10.1f %10.1f %9.1f %9.1f %14.10f" % (
            p, c, med("step_ms"), best, med("forward_ms"), med("backward_ms"), act, use, peak,
            rss, rows[-1]["loss"]))
PY
