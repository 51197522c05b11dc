#!/usr/bin/env bash
# bench/doc_mask.sh — document masking (data.document_mask) against the unmasked run, on
# the CPU, one rank: the step time of each and their ratio, at the shapes of input/tiny.nml
# (4-layer llama, 16 x 128 tokens per step, fp32) and input/gpt2_124m.nml (12 layers,
# d_model 768, seq_len 1024, bf16 storage) at GPT2_BATCH sequences per step (1 by default:
# the deck's 16 take minutes a step on a few cores).
#
#   bench/doc_mask.sh [TESSERA] [ROUNDS]          (default src/tessera, 3)
#
# Environment: SHAPES (default "tiny gpt2_124m"), TINY_STEPS (16), GPT2_STEPS (3),
# GPT2_BATCH (1), THREADS (all cores).  The data are the fortunes corpus of the demo
# (tools/fortunes-corpus.sh: a SentencePiece BPE of 2048 pieces, one document per fortune,
# each ended by the model's </s>, which the masked run takes as its end-of-document id), in
# file order, so both runs of a shape see the same tokens; the script prints the documents'
# mean length.  The first step of a run is a warm-up; the other steps' step_ms
# (metrics.jsonl) of the ROUNDS runs of a configuration give its median and its best (the
# fastest step: the one least disturbed on a shared machine), the masked and the unmasked
# run taking turns in each round (a busy machine slows both alike).  The ratios are masked
# / unmasked, of the medians and of the bests: below 1 masking is faster (it skips the
# attention blocks before each query block's first document).  `uptime` before and after
# shows the load.  The whole script holds `flock /tmp/bench.lock`, so that no other
# benchmark runs alongside; other work on the shared machine still can.  On a loaded
# machine THREADS=1 gives steadier figures (a parallel region waits for its slower thread
# whenever another job holds a core).
set -euo pipefail
if [ -z "${DOC_MASK_LOCKED:-}" ]; then
  exec env DOC_MASK_LOCKED=1 flock /tmp/bench.lock "$0" "$@"
fi
TESSERA=${1:-src/tessera}
ROUNDS=${2:-3}
SHAPES=${SHAPES:-"tiny gpt2_124m"}
TINY_STEPS=${TINY_STEPS:-16}
GPT2_STEPS=${GPT2_STEPS:-3}
GPT2_BATCH=${GPT2_BATCH:-1}
THREADS=${THREADS:-$(nproc)}
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}
here=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/tsr-bench-docmask.XXXXXX)
trap 'rm -rf "$W"' EXIT

"$here/tools/fortunes-corpus.sh" "$W/data" 2048 >"$W/corpus.log" 2>&1 ||
  { cat "$W/corpus.log"; exit 1; }
echo "machine: $(nproc) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1);" \
  "threads $THREADS; $ROUNDS round(s)"
echo "load before: $(uptime)"
for r in $(seq 1 "$ROUNDS"); do
  for shape in $SHAPES; do
    case $shape in
      tiny) args=("$here/input/tiny.nml" run.max_steps="$TINY_STEPS") ;;
      gpt2_124m)
        args=("$here/input/gpt2_124m.nml" run.max_steps="$GPT2_STEPS"
          train.micro_batch="$GPT2_BATCH" train.global_batch="$GPT2_BATCH" parallel.zero_stage=0) ;;
      *) echo "doc_mask.sh: unknown shape '$shape' (tiny, gpt2_124m)" >&2; exit 2 ;;
    esac
    for mask in .false. .true.; do
      out=$W/${shape}_${mask//./}_$r
      echo "round $r: $shape, data.document_mask=$mask" >&2
      OMP_NUM_THREADS=$THREADS "$TESSERA" "${args[@]}" "data.train=$W/data/train_*.bin" \
        data.valid= data.shuffle=.false. run.eval_every=0 run.log_every=1 run.sample_every=0 \
        run.out_dir="$out" checkpoint.resume=none checkpoint.every_steps=0 \
        checkpoint.save_last=.false. data.document_mask="$mask" >"$out.log" 2>&1 ||
        { tail -20 "$out.log"; exit 1; }
    done
  done
done
echo "load after:  $(uptime)"

"$PYTHON_REF" - "$W" "$SHAPES" "$ROUNDS" <<'PY'
import glob, json, re, statistics, sys
import numpy as np
W, shapes, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
log = open(f"{W}/tiny_true_1.log" if "tiny" in shapes else f"{W}/{shapes[0]}_true_1.log").read()
eos = int(re.search(r"documents end with token (\d+)", log).group(1))
n_tok = n_eos = 0
for path in sorted(glob.glob(f"{W}/data/train_*.bin")):
    raw = open(path, "rb").read()
    width = int.from_bytes(raw[8:12], "little")
    tok = np.frombuffer(raw[256:], dtype=np.uint16 if width == 2 else np.uint32)
    n_tok += tok.size
    n_eos += int(np.count_nonzero(tok == eos))
print(f"data: the fortunes corpus, {n_tok} tokens, {n_eos} documents ended by token {eos}: "
      f"{n_tok / max(n_eos, 1):.1f} tokens per document on average")
print("%-10s %6s %7s | %9s %9s %6s | %9s %9s %6s | %8s %8s" % (
    "shape", "tokens", "steps", "unmasked", "masked", "ratio", "best", "best", "ratio",
    "loss", "masked"))
print("%-10s %6s %7s | %9s %9s %6s | %9s %9s %6s |" % ("", "", "", "median ms", "median ms",
                                                      "", "unmasked", "masked", ""))
for s in shapes:
    def steps(mask):
        out, last = [], None
        for r in range(1, rounds + 1):
            rows = [json.loads(l) for l in open(f"{W}/{s}_{mask}_{r}/metrics.jsonl")]
            rows = [x for x in rows if "loss" in x]
            out += [x["step_ms"] for x in rows[1:]]
            last = last or rows
        return out, last
    (a, pa), (b, pb) = steps("false"), steps("true")
    ma, mb = statistics.median(a), statistics.median(b)
    print("%-10s %6d %7d | %9.1f %9.1f %6.3f | %9.1f %9.1f %6.3f | %8.4f %8.4f" % (
        s, pa[0]["tokens"], len(a), ma, mb, mb / ma, min(a), min(b), min(b) / min(a),
        pa[-1]["loss"], pb[-1]["loss"]))
PY
