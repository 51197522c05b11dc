#!/usr/bin/env bash
# torch_ckpt.sh — the reviewer's check as a test: an independent PyTorch model, given only
# a real run's public artefacts (the save_initial checkpoint with its effective deck, the
# token shards and metrics.jsonl), gets the trainer's step-1 loss, grad norm, weights and
# Adam moments after one AdamW step, and step-2 loss (tests/ref/torch_ckpt.py, float64, 1e-5).
# A byte-level fortunes corpus cut into 200-token shards, so the first samples cross shard
# boundaries; 2 micro-batches per step, so gradient accumulation is inside the check.
# Exit 0 pass, 1 fail, 77 skip (no fortunes, or no torch/numpy/h5py for $PYTHON_REF).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
[ -x "$TESSERA" ] || skip "no $TESSERA (run make first)"
fortunes=(/usr/share/games/fortunes/computers /usr/share/games/fortunes/science)
for f in "${fortunes[@]}"; do [ -f "$f" ] || skip "$f not found (apt-get install fortunes)"; done
"$PYTHON_REF" -c 'import torch, numpy, h5py' >/dev/null 2>&1 ||
  skip "$PYTHON_REF cannot import torch, numpy and h5py"
scratch

"$PYTHON_REF" "$top_srcdir/tools/tsr-prepare" --out "$SCRATCH/data" --tokenizer bytes \
  --shard-tokens 200 "${fortunes[@]}" >"$SCRATCH/prepare.out" 2>&1
check "tsr-prepare wrote byte-level shards" test -f "$SCRATCH/data/train_0000.bin"
[ "$TESTS_FAILED" -eq 0 ] || { cat "$SCRATCH/prepare.out"; finish; }

# lr 1e-2 with cosine decay over max_steps = 2: step 1 runs at the schedule's midpoint.
# init_std 0.1 so attention is far from uniform (see torch_ref.sh); grad_clip stays at the
# deck's 1.0, which is active here (grad norm ~3).  keep = 3 keeps step_00000000.h5.
COMMON=(model.vocab_size=256 model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=160
  model.seq_len=32 model.init_std=0.1 train.micro_batch=4 train.global_batch=8
  optim.warmup_steps=0 optim.lr=1e-2 data.shuffle=.false. checkpoint.save_initial=.true.
  checkpoint.every_steps=1 checkpoint.keep=3 checkpoint.resume=none run.max_steps=2
  run.eval_every=0 "data.train=$SCRATCH/data/train_*.bin" "data.valid=$SCRATCH/data/valid_*.bin")
cases=(
  "llama_gqa: model.arch=llama model.n_kv_head=2"
  "gpt2_tied: model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true."
)
for c in "${cases[@]}"; do
  name=${c%%:*}
  # shellcheck disable=SC2086  # the overrides are words on purpose
  "$TESSERA" "$top_srcdir/input/tiny.nml" "${COMMON[@]}" ${c#*:} run.out_dir="$SCRATCH/$name" \
    >"$SCRATCH/$name.out" 2>&1
  rc=$?
  check "$name: tessera trains 2 steps (exit $rc)" test $rc -eq 0
  [ $rc -eq 0 ] || { tail -20 "$SCRATCH/$name.out"; continue; }
  "$PYTHON_REF" "$top_srcdir/tests/ref/torch_ckpt.py" "$SCRATCH/$name" | sed 's/^/  /'
  check "$name: PyTorch from the step-0 checkpoint reproduces steps 1 and 2" \
    test "${PIPESTATUS[0]}" -eq 0
done
finish
