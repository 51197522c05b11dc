#!/usr/bin/env bash
# generate.sh — tessera generate and run.sample_every:
#  - a small model on the fortunes corpus (SentencePiece) trains 8 steps with
#    run.sample_every=4: tessera.log holds the two sample lines, and the last one equals
#    tessera generate --temperature 0 on the final checkpoint;
#  - a seed gives the same text on every run, another seed another text; top-k 1 is
#    greedy; stdout holds the text only (the log goes to stderr); on 2 ranks rank 0
#    prints the same text;
#  - byte-level checkpoints written by 2-rank runs, tp 2 and pp 2, generate on one rank
#    the tokens an independent PyTorch model (tests/ref/torch_generate.py, float64) takes
#    greedily from the same file; the pp 2 run says once that it makes no sample line;
#  - a tp 2 run's sample line (the vocabulary split over the ranks) equals one-rank
#    generate's greedy text from its checkpoint;
#  - the checkpoint carries its tokenizer (/tokenizer/fortunes.model): copied alone to an
#    empty directory, `generate CHECKPOINT` prints the same greedy text with no shards,
#    and so does a deck whose shards are of another tokenizer; --tokenizer PATH gives it
#    too; a checkpoint without /tokenizer (as written before) falls back to the deck's
#    shards; `eval CHECKPOINT` with document masking takes its end of document from the
#    checkpoint, with valid shards that have no model beside them;
#  - bad inputs (no checkpoint, bad options, a deck that does not fit the checkpoint, an
#    old checkpoint with neither shards nor --tokenizer, or with shards missing their
#    SentencePiece model) exit 2 with an error and print nothing on stdout;
#  - tessera linked with the CUDA backend on the emulated GPU draws the CPU's tokens in
#    fp32 and bf16 (run.device = 'cuda').
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
corpus
grep -q '^#define TSR_HAVE_SENTENCEPIECE 1' "$top_builddir/src/core/tsr_build.h" ||
  skip "tessera was built without SentencePiece (apt-get install libsentencepiece-dev, ./configure)"
"$PYTHON_REF" -c 'import torch, numpy, h5py' >/dev/null 2>&1 ||
  skip "$PYTHON_REF cannot import torch, numpy and h5py"
DECK="$top_srcdir/input/tiny.nml"
SMALL=(model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2 model.d_ff=160
  model.seq_len=64 train.micro_batch=4 train.global_batch=8 optim.warmup_steps=2
  run.log_every=4 run.eval_every=0 model.init_std=0.1)
SPM=("data.train=$CORPUS/train_*.bin" "data.valid=$CORPUS/valid_*.bin")
gen() { "$TESSERA" generate "$DECK" "${SMALL[@]}" "$@"; }

# same_as_sample LOG TEXT PROMPT: the last "sample: " line of LOG is PROMPT followed by
# the text generate printed in TEXT (its final newline dropped), escaped as the log does.
same_as_sample() {
  "$PYTHON_REF" - "$@" <<'PY'
import re, sys
log, text, prompt = sys.argv[1], open(sys.argv[2], "rb").read(), sys.argv[3].encode()
# tessera.log stamps every line with the time: "2026-11-24T15:40:01.123Z sample: ..."
lines = [re.sub(rb"^\d{4}-\d\d-\d\dT\S+ ", b"", l) for l in open(log, "rb").read().split(b"\n")]
lines = [l for l in lines if l.startswith(b"sample: ")]
def esc(b):
    names = {10: b"\\n", 9: b"\\t", 92: b"\\\\"}
    return b"".join(names.get(c, b"\\x%02x" % c if c < 32 or c == 127 else bytes([c])) for c in b)
want = b"sample: " + esc(prompt + text[:-1])
print("    log:      %r\n    generate: %r" % (lines[-1][:100] if lines else None, want[:100]))
sys.exit(0 if lines and lines[-1] == want else 1)
PY
}

# ---- SentencePiece: the sample lines, seeds, stdout, 2 ranks
"$TESSERA" "$DECK" "${SMALL[@]}" "${SPM[@]}" optim.lr=3e-3 run.max_steps=8 run.sample_every=4 \
  "run.sample_prompt=Q: What" run.out_dir="$SCRATCH/spm" >"$SCRATCH/spm.out" 2>&1
rc=$?
check "spm: 8 steps with run.sample_every=4 (exit $rc)" test $rc -eq 0
[ $rc -eq 0 ] || { tail -20 "$SCRATCH/spm.out"; finish; }
n=$(grep -Ec '^[^ ]+ sample: Q: What' "$SCRATCH/spm/tessera.log")
check "spm: tessera.log has the sample lines of steps 4 and 8 ($n)" test "$n" -eq 2
G=("${SPM[@]}" run.out_dir="$SCRATCH/spm")
gen "${G[@]}" --prompt "Q: What" --tokens 32 --temperature 0 >"$SCRATCH/greedy.txt" \
  2>"$SCRATCH/greedy.err"
rc=$?
check "spm: generate --temperature 0 exits 0 ($rc)" test $rc -eq 0
check "spm: the step-8 sample line is generate's greedy text from the step-8 checkpoint" \
  same_as_sample "$SCRATCH/spm/tessera.log" "$SCRATCH/greedy.txt" "Q: What"
for s in 11a 11b 12; do
  gen "${G[@]}" --prompt "Q: What" --tokens 24 --seed "${s%[ab]}" >"$SCRATCH/seed$s.txt" \
    2>"$SCRATCH/seed$s.err" || bad "spm: generate --seed ${s%[ab]} exits 0"
done
check "spm: --seed 11 printed some text" test -s "$SCRATCH/seed11a.txt"
check "spm: --seed 11 twice gives the same text" \
  cmp -s "$SCRATCH/seed11a.txt" "$SCRATCH/seed11b.txt"
check "spm: --seed 12 gives another text" \
  test "$(cat "$SCRATCH/seed11a.txt")" != "$(cat "$SCRATCH/seed12.txt")"
check "spm: stdout holds no log line" \
  test -z "$(grep -E '^(generate|checkpoint): ' "$SCRATCH/seed11a.txt")"
check "spm: stderr says what was loaded and generated" \
  grep -q "^generate: .*step_00000008.h5 (step 8), .*tokenizer spm:fortunes" "$SCRATCH/seed11a.err"
gen "${G[@]}" --prompt "Q: What" --tokens 32 --top-k 1 --seed 5 >"$SCRATCH/top1.txt" 2>/dev/null
check "spm: --top-k 1 draws the greedy text" cmp -s "$SCRATCH/top1.txt" "$SCRATCH/greedy.txt"
"$MPIRUN" -np 2 "$TESSERA" generate "$DECK" "${SMALL[@]}" "${G[@]}" --prompt "Q: What" \
  --tokens 24 --seed=11 >"$SCRATCH/np2.txt" 2>"$SCRATCH/np2.err"
rc=$?
check "spm: generate on 2 ranks exits 0 ($rc)" test $rc -eq 0
check "spm: on 2 ranks rank 0's text is printed once, the same as on one" \
  cmp -s "$SCRATCH/np2.txt" "$SCRATCH/seed11a.txt"

# ---- the tokenizer travels with the checkpoint
CK="$SCRATCH/spm/ckpt/step_00000008.h5"
check "spm: the checkpoint carries the tokenizer's model, byte for byte" \
  "$PYTHON_REF" -c 'import sys, h5py
f = h5py.File(sys.argv[1], "r")
sys.exit(0 if f.attrs["tokenizer"] in (b"spm:fortunes", "spm:fortunes") and
         bytes(f["tokenizer/fortunes.model"][()]) == open(sys.argv[2], "rb").read() else 1)' \
  "$CK" "$CORPUS/fortunes.model"
mkdir -p "$SCRATCH/alone"
cp "$CK" "$SCRATCH/alone/"
(cd "$SCRATCH/alone" && "$TESSERA" generate step_00000008.h5 --prompt "Q: What" --tokens 32 \
  --temperature 0 >../alone.txt 2>../alone.err)
rc=$?
check "alone: generate CHECKPOINT in a directory with nothing else exits 0 ($rc)" test $rc -eq 0
check "alone: it prints the greedy text of the run's deck" cmp -s "$SCRATCH/alone.txt" "$SCRATCH/greedy.txt"
check "alone: the log says the tokenizer is the checkpoint's" \
  grep -q "^generate: .*tokenizer spm:fortunes (the checkpoint)" "$SCRATCH/alone.err"
(cd "$SCRATCH/alone" && "$TESSERA" generate step_00000008.h5 --prompt "Q: What" --tokens 32 \
  --temperature 0 --tokenizer "$CORPUS/fortunes.model" >../given.txt 2>../given.err)
check "alone: --tokenizer NAME.model gives the same text" cmp -s "$SCRATCH/given.txt" "$SCRATCH/greedy.txt"
check "alone: the log says the tokenizer is --tokenizer's" \
  grep -q "^generate: .*tokenizer spm:fortunes (--tokenizer)" "$SCRATCH/given.err"
bytes_corpus computers science
gen "${G[@]}" "data.train=$SCRATCH/data/train_*.bin" --prompt "Q: What" --tokens 32 --temperature 0 \
  >"$SCRATCH/other.txt" 2>/dev/null
check "a deck whose shards are of another tokenizer: the checkpoint's tokenizer still" \
  cmp -s "$SCRATCH/other.txt" "$SCRATCH/greedy.txt"
# a checkpoint as written before checkpoints carried their tokenizer
mkdir -p "$SCRATCH/old/ckpt"
cp "$CK" "$SCRATCH/old/ckpt/"
"$PYTHON_REF" -c 'import sys, h5py
with h5py.File(sys.argv[1], "r+") as f: del f["tokenizer"]' "$SCRATCH/old/ckpt/step_00000008.h5"
gen "${SPM[@]}" run.out_dir="$SCRATCH/old" --prompt "Q: What" --tokens 32 --temperature 0 \
  >"$SCRATCH/old.txt" 2>"$SCRATCH/old.err"
check "old checkpoint: the tokenizer of the deck's shards, the same text" \
  cmp -s "$SCRATCH/old.txt" "$SCRATCH/greedy.txt"
check "old checkpoint: the log says so" \
  grep -q "^generate: .*tokenizer spm:fortunes (the shards)" "$SCRATCH/old.err"
mkdir -p "$SCRATCH/valonly"
cp "$CORPUS"/valid_*.bin "$SCRATCH/valonly/"
(cd "$SCRATCH/alone" && "$TESSERA" eval step_00000008.h5 "data.valid=$SCRATCH/valonly/valid_*.bin" \
  data.document_mask=.true. run.out_dir=out >../eval.out 2>&1)
rc=$?
check "alone: eval CHECKPOINT with valid shards alone and document masking exits 0 ($rc)" \
  test $rc -eq 0
check "alone: eval's end of document is the checkpoint tokenizer's </s>" \
  grep -q "document masking: documents end with token 2 .*spm:fortunes', from the checkpoint" \
  "$SCRATCH/eval.out"
check "alone: eval wrote its loss" grep -q '"val_loss"' "$SCRATCH/alone/out/eval.jsonl"

# ---- bytes: checkpoints of tp 2 and pp 2 runs against PyTorch
BYTES=(model.vocab_size=256 optim.lr=1e-2 run.max_steps=10 "run.sample_prompt=Hello"
  run.sample_every=5 "data.train=$SCRATCH/data/train_*.bin" "data.valid=$SCRATCH/data/valid_*.bin")
for layout in tp pp; do
  "$MPIRUN" -np 2 "$TESSERA" "$DECK" "${SMALL[@]}" "${BYTES[@]}" parallel.$layout=2 \
    run.out_dir="$SCRATCH/$layout" >"$SCRATCH/$layout.out" 2>&1
  rc=$?
  check "bytes $layout 2: 10 steps on 2 ranks (exit $rc)" test $rc -eq 0
  [ $rc -eq 0 ] || { tail -20 "$SCRATCH/$layout.out"; continue; }
  gen "${BYTES[@]}" run.out_dir="$SCRATCH/$layout" --prompt Hello --tokens 12 --temperature 0 \
    --ids >"$SCRATCH/$layout.ids" 2>"$SCRATCH/$layout.err"
  rc=$?
  check "bytes $layout 2: one rank generates from the 2-rank checkpoint (exit $rc)" test $rc -eq 0
  "$PYTHON_REF" "$top_srcdir/tests/ref/torch_generate.py" "$SCRATCH/$layout/ckpt/step_00000010.h5" \
    "0 72 101 108 108 111" "$(cat "$SCRATCH/$layout.ids")" | sed 's/^/  /'
  check "bytes $layout 2: the greedy tokens are PyTorch's from the same checkpoint" \
    test "${PIPESTATUS[0]}" -eq 0
done

# ---- tp 2 sample lines: the logits are split over the tp ranks (ids [0, 1024) and
# [1024, 2048) of the spm vocabulary); the greedy pick must take the best of both
"$MPIRUN" -np 2 "$TESSERA" "$DECK" "${SMALL[@]}" "${SPM[@]}" optim.lr=3e-3 run.max_steps=8 \
  run.sample_every=4 "run.sample_prompt=Q: What" parallel.tp=2 run.out_dir="$SCRATCH/spm_tp" \
  >"$SCRATCH/spm_tp.out" 2>&1
rc=$?
check "spm tp 2: 8 steps on 2 ranks with run.sample_every=4 (exit $rc)" test $rc -eq 0
n=$(grep -Ec '^[^ ]+ sample: Q: What' "$SCRATCH/spm_tp/tessera.log")
check "spm tp 2: tessera.log has the sample lines of steps 4 and 8 ($n)" test "$n" -eq 2
T=("${SPM[@]}" run.out_dir="$SCRATCH/spm_tp" --prompt "Q: What" --tokens 32 --temperature 0)
gen "${T[@]}" >"$SCRATCH/spm_tp.txt" 2>/dev/null
gen "${T[@]}" --ids >"$SCRATCH/spm_tp.ids" 2>/dev/null
check "spm tp 2: the greedy tokens come from both tp ranks' halves of the vocabulary" \
  "$PYTHON_REF" -c 'import sys; i = [int(t) for t in open(sys.argv[1]).read().split()]
sys.exit(0 if len(i) == 32 and min(i) < 1024 <= max(i) else 1)' "$SCRATCH/spm_tp.ids"
check "spm tp 2: the step-8 sample line is generate's greedy text on one rank" \
  same_as_sample "$SCRATCH/spm_tp/tessera.log" "$SCRATCH/spm_tp.txt" "Q: What"
check "bytes pp 2: the log says once that a pipeline makes no sample line" \
  test "$(grep -Ec '^[^ ]+ sample: none in this run: run.sample_every needs' \
    "$SCRATCH/pp/tessera.log")" -eq 1

# ---- bad inputs: exit 2, an error, nothing on stdout
expect_input_error() { # expect_input_error WHAT PATTERN ARGS...
  local what=$1 pattern=$2
  shift 2
  gen "$@" >"$SCRATCH/bad.out" 2>"$SCRATCH/bad.err"
  local rc=$?
  if [ $rc -eq 2 ] && grep -q "^error: .*$pattern" "$SCRATCH/bad.err" &&
    [ ! -s "$SCRATCH/bad.out" ]; then
    ok "$what: exit 2, '$pattern'"
  else
    bad "$what: exit $rc (want 2), stderr: $(head -c 300 "$SCRATCH/bad.err")"
  fi
}
expect_input_error "no checkpoint in the directory" "no complete checkpoint in" "${SPM[@]}" \
  run.out_dir="$SCRATCH/empty"
expect_input_error "checkpoint.resume = 'none'" "names no checkpoint" "${G[@]}" \
  checkpoint.resume=none
expect_input_error "--tokens 0" "--tokens '0'" "${G[@]}" --tokens 0
expect_input_error "--tokens ten" "--tokens 'ten'" "${G[@]}" --tokens ten
expect_input_error "--temperature -1" "--temperature '-1'" "${G[@]}" --temperature -1
expect_input_error "--top-k without a value" "--top-k needs a value" "${G[@]}" --top-k
expect_input_error "an unknown option" "unknown option '--topk'" "${G[@]}" --topk 3
expect_input_error "a deck whose model differs from the checkpoint's" \
  "model.d_ff: checkpoint 160, deck 128" "${G[@]}" model.d_ff=128
expect_input_error "an old checkpoint, shards of another tokenizer" \
  "tokenizer 'spm:fortunes', but the deck's data was made with 'bytes'" \
  run.out_dir="$SCRATCH/old" "data.train=$SCRATCH/data/train_*.bin"
expect_input_error "an old checkpoint, no shards, no --tokenizer" "carries no tokenizer file of" \
  run.out_dir="$SCRATCH/old" "data.train=''" "data.valid=''"
mkdir -p "$SCRATCH/nomodel"
cp "$CORPUS"/train_*.bin "$SCRATCH/nomodel/"
expect_input_error "an old checkpoint, spm shards without their model file" \
  "fortunes.model is missing" "data.train=$SCRATCH/nomodel/train_*.bin" run.out_dir="$SCRATCH/old"
expect_input_error "--tokenizer of an unknown kind" "give a SentencePiece model" "${G[@]}" \
  --tokenizer "$SCRATCH/nomodel/train_000.bin"
"$TESSERA" generate >"$SCRATCH/bad.out" 2>&1
rc=$?
check "no deck: exit 2 ($rc) with the usage" \
  test $rc -eq 2 -a -n "$(grep 'usage: tessera generate' "$SCRATCH/bad.out")"

# ---- the device path: tessera linked with the CUDA backend on the emulated GPU
# (emu/emu-tessera.sh) generates the CPU's tokens from the tp 2 checkpoint
EMU="$SCRATCH/tessera-emu"
emu_link tessera "$EMU"
for prec in fp32 bf16; do
  gen "${BYTES[@]}" run.out_dir="$SCRATCH/tp" train.precision=$prec --prompt Hello --tokens 3 \
    --seed 4 --ids >"$SCRATCH/cpu_$prec.ids" 2>/dev/null
  EMU_DEVICES=1 "$EMU" generate "$DECK" "${SMALL[@]}" "${BYTES[@]}" run.out_dir="$SCRATCH/tp" \
    train.precision=$prec run.device=cuda --prompt Hello --tokens 3 --seed 4 --ids \
    >"$SCRATCH/gpu_$prec.ids" 2>"$SCRATCH/gpu_$prec.err"
  rc=$?
  check "emulated GPU, $prec: generate exits 0 ($rc) and says it ran on a GPU" \
    grep -q "^generate: .*$prec on a GPU" "$SCRATCH/gpu_$prec.err"
  [ $rc -eq 0 ] || bad "emulated GPU, $prec: exit $rc: $(tail -3 "$SCRATCH/gpu_$prec.err")"
  check "emulated GPU, $prec: the CPU's tokens ($(cat "$SCRATCH/cpu_$prec.ids"))" \
    cmp -s "$SCRATCH/gpu_$prec.ids" "$SCRATCH/cpu_$prec.ids"
done
finish
