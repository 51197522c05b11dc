"""hf_forward.py — an independent forward pass over a Hugging Face model directory.

    hf_forward.py HF_DIR VALID_GLOB MICRO_BATCH N_BATCHES EXPECTED_LOSS

Written from Hugging Face's published conventions only, not from Tessera's code or docs:
config.json's fields (model_type llama or gpt2), the tensor names of LlamaForCausalLM and
GPT2LMHeadModel in model.safetensors (read here with a small reader of its own), RoPE with
rotate_half (element i paired with i + head_dim/2, cos/sin from inv_freq =
1 / theta^(2j/head_dim) repeated twice; with rope_scaling of rope_type llama3, Llama 3.1's
published rescaling of inv_freq by wavelength), repeat_kv for grouped-query attention, GPT-2's
Conv1D (y = x W + b, W stored [in, out]) and its fused c_attn, gelu_new.  In float64 it
computes the mean next-token cross-entropy of the first N_BATCHES micro-batches of the
validation stream (the token shards' 256-byte header skipped, sample j = tokens
[j T, j T + T], T the metadata's seq_len, else max_position_embeddings) and checks it against EXPECTED_LOSS (what
`tessera eval` logged) to 1e-4.  For llama it also checks that rotating adjacent pairs
instead misses by more than 1e-3, so the check can tell the two conventions apart.  When
transformers is importable, AutoModelForCausalLM loads the directory and must give the
same loss; with sentencepiece, the tokenizer must encode as spm_encode does.
Exit 0 when every check passes."""
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import torch

FAILS = 0


def say(ok, what):
    global FAILS
    print(("PASS: " if ok else "FAIL: ") + what)
    FAILS += not ok


def read_safetensors(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    head = json.loads(blob[8:8 + n])
    meta = head.pop("__metadata__", {})
    kinds = {"F32": torch.float32, "BF16": torch.bfloat16}
    out = {}
    for name, h in head.items():
        b, e = h["data_offsets"]
        t = torch.frombuffer(bytearray(blob[8 + n + b:8 + n + e]), dtype=kinds[h["dtype"]])
        out[name] = t.reshape(h["shape"]).double()
    return out, meta


def valid_tokens(pattern):
    parts = []
    for path in sorted(glob.glob(pattern)):
        raw = open(path, "rb").read()
        assert raw[:8] == b"TSRTOK01", path
        width, _, count = struct.unpack("<IIQ", raw[8:24])
        parts.append(np.frombuffer(raw[256:256 + width * count], dtype=f"<u{width}"))
    return torch.from_numpy(np.concatenate(parts).astype(np.int64))


def causal_attention(q, k, v):
    """q [B, H, T, d], k and v [B, H, T, d] (already repeated for GQA)."""
    T = q.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(s, -1) @ v


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def rotate_adjacent(x, cos, sin):
    """The other convention (pairs 2i, 2i+1), for the negative check only."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[..., : x.shape[-1] // 2], sin[..., : x.shape[-1] // 2]
    return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)


def llama3_inv_freq(inv, rs):
    """Llama 3.1's rope_scaling (rope_type llama3): frequencies whose wavelength exceeds
    original_max_position_embeddings / low_freq_factor are divided by factor, those below
    original / high_freq_factor kept, the band between interpolated smoothly."""
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    mid = (wavelen <= old / low) & (wavelen >= old / high)
    return torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def llama_logits(cfg, w, ids, adjacent=False):
    B, T = ids.shape
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV, eps = cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    hd = C // H

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = cfg.get("rope_scaling")
    if rs:
        assert rs.get("rope_type", rs.get("type")) == "llama3", rs
        inv = llama3_inv_freq(inv, rs)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        if adjacent:
            q, k = rotate_adjacent(q, cos, sin), rotate_adjacent(k, cos, sin)
        else:
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)  # repeat_kv: query head j uses KV head j // (H/KV)
        v = v.repeat_interleave(H // KV, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * (h @ w[p + "mlp.up_proj.weight"].T)) @ \
            w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def gpt2_logits(cfg, w, ids):
    B, T = ids.shape
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = C // H

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv1d(x, p):
        return x @ w[p + ".weight"] + w[p + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))

    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][torch.arange(T)]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, -1)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        x = x + conv1d(causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C), p + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    head = w["transformer.wte.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def mean_loss(logits_of, batches):
    losses = []
    for b in batches:
        lg = logits_of(b[:, :-1])
        losses.append(torch.nn.functional.cross_entropy(
            lg.reshape(-1, lg.shape[-1]).double(), b[:, 1:].reshape(-1)).item())
    return sum(losses) / len(losses)


def main():
    hf, pattern, mb, nb, expected = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
        float(sys.argv[5])
    cfg = json.load(open(os.path.join(hf, "config.json")))
    w, meta = read_safetensors(os.path.join(hf, "model.safetensors"))
    arch = cfg["model_type"]
    T = cfg["max_position_embeddings"] if arch == "llama" else cfg["n_positions"]
    T = int(meta.get("seq_len", T))  # the run's sequences (the model's context may be longer)
    L = cfg["num_hidden_layers"] if arch == "llama" else cfg["n_layer"]
    if arch == "llama":
        per = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
               "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
               "mlp.down_proj"]
        want = {"model.embed_tokens.weight", "model.norm.weight"} | {
            f"model.layers.{i}.{m}.weight" for i in range(L) for m in per}
    else:
        per = ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"]
        want = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                "transformer.ln_f.bias"} | {f"transformer.h.{i}.{m}.{k}" for i in range(L)
                                           for m in per for k in ("weight", "bias")}
    if not cfg["tie_word_embeddings"]:
        want.add("lm_head.weight")
    say(set(w) == want, f"{arch}: model.safetensors holds exactly the {len(want)} HF tensors "
        f"({sorted(set(w) ^ want)[:4]})")
    say(cfg["architectures"] == [{"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}[arch]]
        and meta.get("format") == "pt", f"{arch}: architectures {cfg['architectures']}, format pt")

    toks = valid_tokens(pattern)
    batches = [torch.stack([toks[j * T:j * T + T + 1] for j in range(b * mb, b * mb + mb)])
               for b in range(nb)]
    with torch.no_grad():
        fwd = (lambda ids: llama_logits(cfg, w, ids)) if arch == "llama" else \
            (lambda ids: gpt2_logits(cfg, w, ids))
        loss = mean_loss(fwd, batches)
        say(abs(loss - expected) < 1e-4, f"{arch}: the HF-convention forward gives loss "
            f"{loss:.7f}, tessera eval {expected:.7f} (difference {abs(loss - expected):.1e} < 1e-4)")
        if arch == "llama":
            wrong = mean_loss(lambda ids: llama_logits(cfg, w, ids, adjacent=True), batches)
            say(abs(wrong - expected) > 1e-3, f"{arch}: adjacent-pair RoPE instead gives "
                f"{wrong:.7f} (off by {abs(wrong - expected):.1e} > 1e-3): the check sees RoPE")
    try:
        import transformers
    except ImportError:
        print(f"    (transformers is not importable by {sys.executable}: AutoModelForCausalLM "
              f"not tried)")
        return
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float64).eval()
    with torch.no_grad():
        auto = mean_loss(lambda ids: model(ids).logits, batches)
    say(abs(auto - expected) < 1e-4, f"{arch}: transformers {transformers.__version__} "
        f"AutoModelForCausalLM ({type(model).__name__}) gives loss {auto:.7f} (difference "
        f"{abs(auto - expected):.1e} < 1e-4)")
    if not os.path.exists(os.path.join(hf, "tokenizer.model")):
        return
    try:
        import sentencepiece  # noqa: F401  (LlamaTokenizer needs it)
    except ImportError:
        print("    (no sentencepiece module: the tokenizer not tried)")
        return
    text = "Real programmers don't comment their code.  It was hard to write,\t it should be hard"
    tk = transformers.AutoTokenizer.from_pretrained(hf, use_fast=False)
    ids = tk(text)["input_ids"]
    if shutil.which("spm_encode"):
        ref = subprocess.run(["spm_encode", f"--model={hf}/tokenizer.model", "--output_format=id"],
                             input=text + "\n", capture_output=True, text=True).stdout.split()
        say(ids == [int(i) for i in ref] and tk.decode(ids) == text,
            f"{arch}: {type(tk).__name__} encodes as spm_encode ({len(ids)} ids) and decodes back")


if __name__ == "__main__":
    main()
    sys.exit(1 if FAILS else 0)
