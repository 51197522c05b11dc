#!/usr/bin/env bash
# bench/cpu_torch.sh — Tessera's CPU backend against a PyTorch training loop of the same
# model, batch, data and optimizer on this machine, in one run (issue 8): tokens/s and
# ms/step per phase (forward, backward, optimizer) for input/tiny.nml and
# input/gpt2_124m.nml, and their ratios.
#
#   bench/cpu_torch.sh [TESSERA] [STEPS] [ROUNDS]      (default src/tessera, 10, 3)
#
# Environment: THREADS (default: all cores) threads for both sides; DECKS (default
# "tiny gpt2_124m"); GPT2_STEPS (default 4) and GPT2_ROUNDS (default 1); GPT2_SEQ and
# GPT2_BATCH (default 1024 and 1); PYTHON_REF (default /usr/bin/python3, Debian's torch).
#
# Both sides, every deck:
# - one rank (dp = tp = pp = 1), fp32, shuffle off; the data is the fortunes corpus of
#   the demo (tools/fortunes-corpus.sh: Debian's fortunes, 2048-piece SentencePiece BPE),
#   step s reading samples s*global_batch ... in order;
# - the model of the deck, initialised once by Tessera and written as its step-0
#   checkpoint, which bench/torch_train.py loads (weights and effective deck), so both
#   start from the same weights and see the same batches: the losses printed for the
#   first and last step agree to fp32 roundoff;
# - AdamW with the deck's schedule and clipping; 2 warm-up steps, then STEPS timed ones.
# gpt2_124m is shrunk for a 2-core machine, identically on both sides: one sequence of
# GPT2_SEQ tokens per step (train.micro_batch = global_batch = 1; the deck has 16 x 1024
# per rank and 512 per step) and fp32 instead of its bf16.
#
# Threads: Tessera runs its OpenMP team with OpenBLAS single-threaded inside it (src/cpu/*.c).
# PyTorch runs torch.set_num_threads(THREADS) twice, with OPENBLAS_NUM_THREADS = THREADS
# and = 1 (its intra-op pool and OpenBLAS's pthreads compete for the cores, so the second
# is often faster here); the ratio is against the faster of the two.
#
# Columns: ms per step and per phase are medians over the timed steps of a round, then
# the median over ROUNDS rounds (tessera and torch alternate inside a round, so a busy
# machine slows both); tok/s = tokens per step / median ms per step.  Phases:
#   tessera  forward / backward: tsr_model_chunk_forward / _backward (metrics.jsonl);
#            optimizer: zeroing the gradients, their reduction, the norm, clipping, AdamW
#            and publishing the parameters;
#   torch    model(x, y) with the loss / loss.backward() / clip_grad_norm_, step, zero_grad.
set -euo pipefail
TESSERA=${1:-src/tessera}
STEPS=${2:-10}
ROUNDS=${3:-3}
THREADS=${THREADS:-$(nproc)}
DECKS=${DECKS:-"tiny gpt2_124m"}
GPT2_STEPS=${GPT2_STEPS:-4}
GPT2_ROUNDS=${GPT2_ROUNDS:-1}
GPT2_SEQ=${GPT2_SEQ:-1024}
GPT2_BATCH=${GPT2_BATCH:-1}
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}
WARMUP=2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
here=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/tsr-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT

"$here/tools/fortunes-corpus.sh" "$W/data" 2048 >"$W/corpus.log" 2>&1 ||
  { cat "$W/corpus.log"; exit 1; }
torch_version=$("$PYTHON_REF" -c 'import torch; print(torch.__version__)')
echo "machine: $(nproc) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)," \
  "$(($(sed -n 's/^MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo) / 1048576)) GiB;" \
  "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; torch $torch_version"
echo "threads $THREADS, warm-up $WARMUP steps; tiny: $STEPS timed steps x $ROUNDS rounds;" \
  "gpt2_124m: $GPT2_STEPS x $GPT2_ROUNDS, shrunk to $GPT2_BATCH x $GPT2_SEQ tokens per step, fp32"

# run_tessera DECK OUT STEPS [overrides...]: one training run; metrics in OUT
run_tessera() {
  local deck=$1 out=$2 steps=$3
  shift 3
  OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS "$TESSERA" "$here/input/$deck.nml" \
    "data.train=$W/data/train_*.bin" "data.valid=" data.shuffle=.false. train.precision=fp32 \
    run.eval_every=0 run.max_steps=$((WARMUP + steps)) run.log_every=1000 \
    run.out_dir="$out" checkpoint.resume=none checkpoint.every_steps=0 \
    checkpoint.save_initial=.true. checkpoint.keep=2 "$@" >"$out.log" 2>&1 ||
    { tail -20 "$out.log"; exit 1; }
}

# run_torch INIT OUT STEPS BLAS_THREADS
run_torch() {
  OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$4 "$PYTHON_REF" "$here/bench/torch_train.py" \
    "$1" "$3" $WARMUP "$THREADS" "$2.json" >"$2.log" 2>&1 || { tail -20 "$2.log"; exit 1; }
}

for deck in $DECKS; do
  steps=$STEPS rounds=$ROUNDS over=()
  if [ "$deck" = gpt2_124m ]; then
    steps=$GPT2_STEPS rounds=$GPT2_ROUNDS
    over=(train.micro_batch=$GPT2_BATCH train.global_batch=$GPT2_BATCH model.seq_len=$GPT2_SEQ)
  fi
  for r in $(seq 1 "$rounds"); do
    run_tessera "$deck" "$W/$deck.tessera.$r" "$steps" "${over[@]}"
    init=$W/$deck.tessera.1/ckpt/step_00000000.h5
    run_torch "$init" "$W/$deck.torch_blas$THREADS.$r" "$steps" "$THREADS"
    [ "$THREADS" = 1 ] || run_torch "$init" "$W/$deck.torch_blas1.$r" "$steps" 1
    find "$W/$deck.tessera.$r/ckpt" -name 'step_*.h5' ! -name step_00000000.h5 -delete
    [ "$r" = 1 ] || rm -f "$W/$deck.tessera.$r/ckpt/step_00000000.h5" # disk: gpt2 is 1.5 GB
  done
done

"$PYTHON_REF" - "$W" "$THREADS" $WARMUP "$DECKS" <<'PY'
import glob, json, os, statistics, sys
W, threads, warmup, decks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
KEYS = ("step_ms", "forward_ms", "backward_ms", "optimizer_ms")

def tessera_rows(out):
    rows = [json.loads(l) for l in open(out + "/metrics.jsonl")]
    return [r for r in rows if "loss" in r]

def tessera_round(out):
    rows = tessera_rows(out)
    timed = rows[warmup:]
    return {k: statistics.median(r[k] for r in timed) for k in KEYS}, rows

def torch_round(path):
    d = json.load(open(path))
    return d["median"], d["steps"]

def tokens_per_step(out):
    log = open(out + ".log").read()
    import re
    m = re.search(r"micro-batches of (\d+) x (\d+) tokens", log)
    g = re.search(r"batch: global (\d+) sequences", log)
    return int(g.group(1)) * int(m.group(2)), log

print()
hdr = "%-10s %-24s %9s %9s %9s %9s %9s %9s %9s" % (
    "deck", "side", "tok/s", "ms/step", "forward", "backward", "optimizer", "loss@1", "loss@N")
print(hdr)
summary = []
for deck in decks:
    outs = sorted(glob.glob(os.path.join(W, deck + ".tessera.*")))
    outs = [o for o in outs if os.path.isdir(o)]
    tok, log = tokens_per_step(outs[0])
    sides = [("tessera", [tessera_round(o) for o in outs])]
    for blas in sorted({threads, 1}, reverse=True):
        files = sorted(glob.glob(os.path.join(W, "%s.torch_blas%d.*.json" % (deck, blas))))
        if files:
            sides.append(("torch blas %d" % blas, [torch_round(f) for f in files]))
    res = {}
    for name, rounds in sides:
        med = {k: statistics.median(r[0][k] for r in rounds) for k in KEYS}
        steps = rounds[0][1]
        res[name] = med
        print("%-10s %-24s %9.0f %9.1f %9.1f %9.1f %9.1f %9.4f %9.4f" % (
            deck, name + " (%d rounds)" % len(rounds), tok / (med["step_ms"] / 1e3),
            med["step_ms"], med["forward_ms"], med["backward_ms"], med["optimizer_ms"],
            steps[0]["loss"], steps[-1]["loss"]))
    torch_names = [n for n in res if n.startswith("torch")]
    best = min(torch_names, key=lambda n: res[n]["step_ms"])
    t, p = res["tessera"], res[best]
    ratio = {k: p[k] / t[k] for k in KEYS}
    print("%-10s %-24s %9.2f %9s %9.2f %9.2f %9.2f   (%s ms / tessera ms: > 1 = tessera faster)"
          % (deck, "ratio vs " + best, ratio["step_ms"], "", ratio["forward_ms"],
             ratio["backward_ms"], ratio["optimizer_ms"], best))
    summary.append("%s: tessera %.0f tok/s, torch %.0f tok/s (%s): %.2fx" % (
        deck, tok / (t["step_ms"] / 1e3), tok / (p["step_ms"] / 1e3), best, ratio["step_ms"]))
print()
for s in summary:
    print(s)
PY
