#!/bin/bash
# torch_ref.sh — correctness ladder level 2: the whole model's loss, every parameter
# gradient and one AdamW step against an independent PyTorch model, fp32, 1e-5.
#
# tests/ref/dump_ref (C, Tessera's modules) writes weights, gradients, the batch and the
# weights after one optimizer step to HDF5; tests/ref/torch_ref.py rebuilds the model from
# docs/model.md in float64 and compares, document masking included.  Skips (77) without Debian's torch/numpy/h5py.
set -u

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}

if ! "$PYTHON_REF" -c 'import torch, numpy, h5py' >/dev/null 2>&1; then
  echo "torch_ref.sh: SKIP: $PYTHON_REF cannot import torch, numpy and h5py"
  exit 77
fi

dump_ref=$top_builddir/tests/ref/dump_ref
if [ ! -x "$dump_ref" ]; then
  echo "torch_ref.sh: $dump_ref not built (make check builds it)" >&2
  exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/torch_ref.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# Small but not trivial: 2 layers, a vocabulary that is not a power of two, 3 sequences.
# init_std 0.1 (default 0.02) makes attention far from uniform, so a wrong RoPE or
# GQA mapping shows in the loss too, not only in the q/k gradients.
small="model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=96 model.vocab_size=97
       model.seq_len=16 train.micro_batch=3 train.global_batch=3 run.seed=1234"

cases=(
  "llama_gqa: $small model.arch=llama model.n_kv_head=2 model.init_std=0.1 train.grad_clip=1.0"
  "gpt2_tied: $small model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true.
              model.init_std=0.1 train.grad_clip=1.0"
  "llama_mqa_tied_noclip: $small model.arch=llama model.n_kv_head=1 model.tie_embeddings=.true.
              train.grad_clip=0 optim.lr=1e-2 optim.warmup_steps=0 optim.decay=constant
              optim.weight_decay=0.1"
  "llama_recompute_full: $small model.arch=llama model.n_kv_head=2 model.init_std=0.1
              train.grad_clip=1.0 train.recompute=full"
  # the LM head and loss in chunks of 7 of the 48 tokens (the last one ragged), and unfused
  "gpt2_tied_head_chunks: $small model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true.
              model.init_std=0.1 train.grad_clip=1.0 train.xent_chunk_tokens=7"
  "llama_head_unfused: $small model.arch=llama model.n_kv_head=2 model.init_std=0.1
              train.grad_clip=1.0 train.xent_chunk_tokens=0"
  # Llama 3.1's RoPE rescaling; an original context of 64 puts the 8 frequencies of a head
  # (wavelengths 6.3, 32, 167, ...) in all three bands: kept (< 64/4), interpolated, divided
  # by the factor (> 64/1)
  "llama_rope_llama3: $small model.arch=llama model.n_kv_head=2 model.init_std=0.1
              train.grad_clip=1.0 model.rope_theta=500000 model.rope_scaling=llama3
              model.rope_factor=8 model.rope_low_freq_factor=1 model.rope_high_freq_factor=4
              model.rope_original_context=64"
  # document masking: packed sequences of several documents (tests/ref/dump_ref.c's batch: the
  # first document of each sequence begun before it, one-token documents, an end of
  # document on the last input, a sequence of one document), attention inside each and
  # positions (RoPE; gpt2's learned ones) restarting at 0
  "llama_gqa_docs: $small model.arch=llama model.n_kv_head=2 model.init_std=0.1
              train.grad_clip=1.0 data.document_mask=.true. data.eos_id=5"
  "gpt2_tied_docs: $small model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true.
              model.init_std=0.1 train.grad_clip=1.0 data.document_mask=.true. data.eos_id=5"
  "llama_docs_recompute_full: $small model.arch=llama model.n_kv_head=2 model.init_std=0.1
              train.grad_clip=1.0 train.recompute=full data.document_mask=.true. data.eos_id=5"
)

failed=0
for c in "${cases[@]}"; do
  name=${c%%:*}
  # shellcheck disable=SC2086  # the overrides are words on purpose
  set -- ${c#*:}
  echo "=== $name: $*"
  if ! "$dump_ref" "$tmp/$name.h5" "$@"; then
    echo "torch_ref.sh: FAIL: dump_ref failed for $name" >&2
    failed=1
    continue
  fi
  if ! "$PYTHON_REF" "$top_srcdir/tests/ref/torch_ref.py" "$tmp/$name.h5"; then
    echo "torch_ref.sh: FAIL: $name disagrees with the PyTorch reference" >&2
    failed=1
  fi
done

if [ "$failed" -ne 0 ]; then
  echo "torch_ref.sh: FAIL"
  exit 1
fi
echo "torch_ref.sh: PASS (${#cases[@]} configurations)"
exit 0
