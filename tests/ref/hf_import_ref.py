"""hf_import_ref.py — the Hugging Face side of tests/tools/import_hf.sh, run with transformers.

    hf_import_ref.py make KIND DIR [--dtype fp32|bf16] [--vocab V]
        a tiny random model saved by save_pretrained as sharded safetensors (a small
        max_shard_size, so model.safetensors.index.json names several files).  KIND:
          llama  LlamaForCausalLM, grouped-query (4 heads, 2 KV heads), untied head,
                 rope_theta 500000, rope_scaling llama3 (original context 64: a head's 8
                 frequencies fall in all three bands), context 128;
          gpt2   GPT2LMHeadModel, tied head, context 128.
    hf_import_ref.py loss DIR GLOB T MICRO_BATCH N_BATCHES [--pad-to V]
        the model's mean next-token loss (float64) over the first N_BATCHES micro-batches of
        the token stream of the Tessera shards GLOB, sample j = tokens [j T, j T + T] as
        `tessera eval` reads them; --pad-to appends zero rows to the embedding and head, as
        tools/tsr-import --pad-vocab-to does.
    hf_import_ref.py generate DIR IDS N VOCAB
        model.generate's greedy continuation (float64) of the ids IDS by N tokens, ids of
        VOCAB and above suppressed (Tessera's generate picks among the tokenizer's ids).
"""
import argparse
import glob
import struct
import sys

import numpy as np
import torch
import transformers


def make(args):
    torch.manual_seed({"llama": 11, "gpt2": 12}[args.kind])
    if args.kind == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=args.vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
            initializer_range=0.1,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(
            vocab_size=args.vocab, n_embd=64, n_layer=2, n_head=4, n_inner=160, n_positions=128,
            layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            initializer_range=0.1, tie_word_embeddings=True)
        model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():  # norms away from 1 and biases away from 0: every tensor matters
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(args.dir, max_shard_size="100KB", safe_serialization=True)


def tokens(pattern):
    parts = []
    for path in sorted(glob.glob(pattern)):
        raw = open(path, "rb").read()
        width, _, count = struct.unpack("<IIQ", raw[8:24])
        parts.append(np.frombuffer(raw[256:256 + width * count], dtype=f"<u{width}"))
    return torch.from_numpy(np.concatenate(parts).astype(np.int64))


def load(d, pad_to=0):
    model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64).eval()
    if pad_to:
        emb = model.get_input_embeddings().weight
        V, C = emb.shape
        with torch.no_grad():
            new = torch.cat([emb, torch.zeros(pad_to - V, C, dtype=emb.dtype)])
            model.get_input_embeddings().weight = torch.nn.Parameter(new)
            if model.config.tie_word_embeddings:
                model.get_output_embeddings().weight = model.get_input_embeddings().weight
            else:
                head = model.get_output_embeddings().weight
                model.get_output_embeddings().weight = torch.nn.Parameter(
                    torch.cat([head, torch.zeros(pad_to - V, C, dtype=head.dtype)]))
    return model


def loss(args):
    model = load(args.dir, args.pad_to)
    toks, T, mb = tokens(args.glob), args.T, args.micro_batch
    total = 0.0
    with torch.no_grad():
        for b in range(args.n_batches):
            x = torch.stack([toks[j * T:j * T + T + 1] for j in range(b * mb, b * mb + mb)])
            lg = model(x[:, :-1]).logits
            total += torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]),
                                                       x[:, 1:].reshape(-1)).item()
    print(repr(total / args.n_batches))


def generate(args):
    model = load(args.dir)
    ids = torch.tensor([[int(t) for t in args.ids.split()]])
    V = model.config.vocab_size
    bad = [[i] for i in range(args.vocab, V)]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=args.n, do_sample=False, num_beams=1,
                             bad_words_ids=bad or None, pad_token_id=0,
                             attention_mask=torch.ones_like(ids))
    print(" ".join(str(int(t)) for t in out[0, ids.shape[1]:]))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make")
    p.add_argument("kind", choices=("llama", "gpt2"))
    p.add_argument("dir")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--vocab", type=int, default=256)
    p = sub.add_parser("loss")
    p.add_argument("dir")
    p.add_argument("glob")
    p.add_argument("T", type=int)
    p.add_argument("micro_batch", type=int)
    p.add_argument("n_batches", type=int)
    p.add_argument("--pad-to", type=int, default=0)
    p = sub.add_parser("generate")
    p.add_argument("dir")
    p.add_argument("ids")
    p.add_argument("n", type=int)
    p.add_argument("vocab", type=int)
    args = ap.parse_args()
    {"make": make, "loss": loss, "generate": generate}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
