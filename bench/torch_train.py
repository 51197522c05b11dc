#!/usr/bin/python3
"""torch_train.py: the PyTorch reference training loop of bench/cpu_torch.sh.

    torch_train.py INIT.h5 STEPS WARMUP THREADS [OUT.json]

Trains the model of a Tessera checkpoint (normally the run's step_00000000.h5, written
with checkpoint.save_initial) for STEPS optimizer steps on the same data, batch and
optimizer as the Tessera run that wrote it, and prints ms/step per phase.  Everything is
read from the checkpoint: the weights (/model/<name>) and the effective deck (root
attribute "deck"), so the two sides cannot drift apart.

The model is the one of docs/model.md (the structure of
tests/ref/torch_ref.py) in float32, written the way one would write it for speed in torch 1.13
(Debian's python3-torch; no scaled_dot_product_attention there): fused Q|K|V and gate|up
weights, one GEMM each; explicit causal softmax attention; torch.optim.AdamW with the
faster of its two CPU code paths (foreach); clip_grad_norm_.
  llama: RMSNorm, RoPE (half-split), GQA, SwiGLU, no biases, untied head.
  gpt2:  LayerNorm, learned positions, GELU (tanh), biases, tied head.
Data: &data train, read as Tessera reads it with shuffle = .false. (the caller sets it):
step s uses samples s*global_batch ... of the concatenated shards, sample k being tokens
[k*seq_len, k*seq_len + seq_len] (inputs, then the next-token targets).  Gradient
accumulation over global_batch / micro_batch micro-batches as in the trainer.

Phases (one micro-batch per step in the bench; with more they are summed over the step):
  forward    the model's forward and the mean cross-entropy
  backward   loss.backward()
  optimizer  clip_grad_norm_, AdamW step, zero_grad
The first WARMUP steps are run and not timed.  Printed: one line per step, then
"torch: median ms/step ..." and, with OUT.json, the same numbers as JSON.
"""
import glob
import json
import math
import statistics
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F


# ---------------------------------------------------------------- the deck

def parse_deck(text):
    """The effective deck as Tessera writes it: '&group', 'key = value', '/'."""
    cfg = {}
    for line in text.splitlines():
        line = line.strip()
        if "=" not in line or line.startswith("!"):
            continue
        key, val = (s.strip() for s in line.split("=", 1))
        if val.startswith("'"):
            val = val[1:-1].replace("''", "'")
        elif val in (".true.", ".false."):
            val = val == ".true."
        else:
            try:
                val = int(val)
            except ValueError:
                val = float(val.replace("d", "e").replace("D", "e"))
        cfg[key] = val
    return cfg


def lr_at(cfg, step):
    """tsr_optim_lr (src/model/optim.c): warmup, then cosine / linear / wsd / constant."""
    lr, min_lr, warm = cfg["lr"], cfg["min_lr"], cfg["warmup_steps"]
    if warm > 0 and step <= warm:
        return lr * step / warm
    total = cfg["decay_steps"] if cfg["decay_steps"] > 0 else cfg["max_steps"]
    if cfg["decay"] == "constant" or total <= warm:
        return lr
    p = min(max((step - warm) / (total - warm), 0.0), 1.0)
    if cfg["decay"] == "linear":
        return lr + (min_lr - lr) * p
    if cfg["decay"] == "wsd":
        start = 1.0 - cfg["wsd_decay_frac"]
        return lr if p <= start else lr + (min_lr - lr) * (p - start) / cfg["wsd_decay_frac"]
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


# ---------------------------------------------------------------- the data

class Tokens:
    """The concatenated token stream of a glob of *.bin shards (docs/formats.md "Token shards")."""

    def __init__(self, pattern, seq_len):
        parts = []
        for path in sorted(glob.glob(pattern)):
            with open(path, "rb") as f:
                head = f.read(256)
            assert head[:8] == b"TSRTOK01", path
            width = int.from_bytes(head[8:12], "little")
            count = int.from_bytes(head[16:24], "little")
            dtype = np.uint16 if width == 2 else np.uint32
            parts.append(np.memmap(path, dtype=dtype, mode="r", offset=256, shape=(count,)))
        assert parts, "no shards match " + pattern
        self.stream = np.concatenate([p.astype(np.int64) for p in parts])
        self.T = seq_len
        self.n_samples = (len(self.stream) - 1) // seq_len

    def batch(self, first, count):
        rows = [self.stream[j * self.T: j * self.T + self.T + 1]
                for j in ((first + i) % self.n_samples for i in range(count))]
        both = torch.from_numpy(np.stack(rows))
        return both[:, :-1].contiguous(), both[:, 1:].contiguous()


# ---------------------------------------------------------------- the model

class Model(torch.nn.Module):
    def __init__(self, cfg, tensors):
        super().__init__()
        self.cfg = cfg
        self.gpt2 = cfg["arch"] == "gpt2"
        C, H, KV = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"]
        self.H, self.KV, self.hd = H, KV, C // H
        P = lambda a: torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(a, np.float32)))
        cat = lambda *names: P(np.concatenate([tensors[n] for n in names]))
        opt = lambda name: P(tensors[name]) if name in tensors else None
        self.embed = P(tensors["embed.weight"])
        self.pos = opt("pos_embed.weight")
        self.layers = torch.nn.ModuleList()
        for l in range(cfg["n_layer"]):
            p = "layers.%03d." % l
            m = torch.nn.Module()
            m.n1w, m.n1b = P(tensors[p + "attn_norm.weight"]), opt(p + "attn_norm.bias")
            m.n2w, m.n2b = P(tensors[p + "mlp_norm.weight"]), opt(p + "mlp_norm.bias")
            m.wqkv = cat(p + "attn.wq.weight", p + "attn.wk.weight", p + "attn.wv.weight")
            m.bqkv = (cat(p + "attn.wq.bias", p + "attn.wk.bias", p + "attn.wv.bias")
                      if self.gpt2 else None)
            m.wo, m.bo = P(tensors[p + "attn.wo.weight"]), opt(p + "attn.wo.bias")
            if self.gpt2:
                m.wfc, m.bfc = P(tensors[p + "mlp.w_up.weight"]), opt(p + "mlp.w_up.bias")
            else:
                m.wfc, m.bfc = cat(p + "mlp.w_gate.weight", p + "mlp.w_up.weight"), None
            m.wdown, m.bdown = P(tensors[p + "mlp.w_down.weight"]), opt(p + "mlp.w_down.bias")
            self.layers.append(m)
        self.nfw, self.nfb = P(tensors["final_norm.weight"]), opt("final_norm.bias")
        self.head = None if cfg["tie_embeddings"] else P(tensors["lm_head.weight"])
        T, half = cfg["seq_len"], self.hd // 2
        inv = cfg["rope_theta"] ** (-2.0 * torch.arange(half, dtype=torch.float64) / self.hd)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", torch.cos(ang).float(), persistent=False)
        self.register_buffer("sin", torch.sin(ang).float(), persistent=False)
        self.register_buffer("future", torch.triu(torch.ones(T, T, dtype=torch.bool), 1),
                             persistent=False)

    def norm(self, x, w, b):
        if self.gpt2:
            return F.layer_norm(x, (x.shape[-1],), w, b, self.cfg["norm_eps"])
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["norm_eps"]) * w

    def rope(self, x):  # [B, heads, T, hd]
        half = self.hd // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * self.cos - b * self.sin, a * self.sin + b * self.cos], dim=-1)

    def attention(self, m, x):
        B, T, _ = x.shape
        H, KV, hd = self.H, self.KV, self.hd
        qkv = F.linear(x, m.wqkv, m.bqkv)
        q, k, v = qkv.split([H * hd, KV * hd, KV * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, KV, hd).transpose(1, 2)
        v = v.view(B, T, KV, hd).transpose(1, 2)
        if not self.gpt2:
            q, k = self.rope(q), self.rope(k)
        if KV != H:  # query head j reads KV head j // (H / KV)
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        s = s.masked_fill(self.future, float("-inf"))
        y = torch.softmax(s, dim=-1) @ v
        return F.linear(y.transpose(1, 2).reshape(B, T, H * hd), m.wo, m.bo)

    def mlp(self, m, x):
        h = F.linear(x, m.wfc, m.bfc)
        if self.gpt2:
            h = F.gelu(h, approximate="tanh")
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return F.linear(h, m.wdown, m.bdown)

    def forward(self, inputs, targets):
        B, T = inputs.shape
        x = F.embedding(inputs, self.embed)
        if self.pos is not None:
            x = x + self.pos[:T]
        for m in self.layers:
            x = x + self.attention(m, self.norm(x, m.n1w, m.n1b))
            x = x + self.mlp(m, self.norm(x, m.n2w, m.n2b))
        x = self.norm(x, self.nfw, self.nfb)
        logits = F.linear(x, self.embed if self.head is None else self.head)
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


# ---------------------------------------------------------------- the loop

def main(init, steps, warmup, threads, out_json=None):
    torch.set_num_threads(threads)
    with h5py.File(init, "r") as f:
        deck = f.attrs["deck"]
        deck = deck.decode() if isinstance(deck, bytes) else str(deck)
        tensors = {n: np.array(f["model"][n]) for n in f["model"].keys()}
    cfg = parse_deck(deck)
    assert cfg["precision"] == "fp32", "the reference loop is fp32"
    assert not cfg["shuffle"], "the reference loop reads samples in order (shuffle = .false.)"
    model = Model(cfg, tensors)
    del tensors
    params = list(model.parameters())
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                            foreach=True)
    data = Tokens(cfg["train"], cfg["seq_len"])
    mb, gb = cfg["micro_batch"], cfg["global_batch"]
    accum = gb // mb
    tokens_per_step = gb * cfg["seq_len"]
    n_params = sum(p.numel() for p in params)
    print("torch: %s, %d parameters, %d threads, %d + %d steps of %d x %d tokens "
          "(%d micro-batch(es))" % (cfg["arch"], n_params, torch.get_num_threads(), warmup,
                                    steps, gb, cfg["seq_len"], accum), flush=True)
    rows = []
    for step in range(1, warmup + steps + 1):
        t0 = time.perf_counter()
        fwd = bwd = 0.0
        loss_sum = 0.0
        for a in range(accum):
            inputs, targets = data.batch((step - 1) * gb + a * mb, mb)
            ta = time.perf_counter()
            loss = model(inputs, targets)
            tb = time.perf_counter()
            (loss / accum).backward()
            tc = time.perf_counter()
            fwd += tb - ta
            bwd += tc - tb
            loss_sum += float(loss)
        to = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        if cfg["grad_clip"] > 0:
            gnorm = float(torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"]))
        else:
            gnorm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        row = {"step": step, "loss": loss_sum / accum, "grad_norm": gnorm,
               "step_ms": (t1 - t0) * 1e3, "forward_ms": fwd * 1e3, "backward_ms": bwd * 1e3,
               "optimizer_ms": (t1 - to) * 1e3}
        print("torch step %4d | loss %.4f | grad norm %.4f | %8.1f ms | fwd %.1f bwd %.1f opt %.1f"
              % (step, row["loss"], gnorm, row["step_ms"], row["forward_ms"], row["backward_ms"],
                 row["optimizer_ms"]), flush=True)
        rows.append(row)
    timed = rows[warmup:]
    med = {k: statistics.median(r[k] for r in timed)
           for k in ("step_ms", "forward_ms", "backward_ms", "optimizer_ms")}
    med["tokens_per_s"] = tokens_per_step / (med["step_ms"] / 1e3)
    print("torch: median ms/step %.1f (forward %.1f, backward %.1f, optimizer %.1f), %.0f tok/s"
          % (med["step_ms"], med["forward_ms"], med["backward_ms"], med["optimizer_ms"],
             med["tokens_per_s"]))
    if out_json:
        with open(out_json, "w") as f:
            json.dump({"median": med, "steps": rows, "threads": torch.get_num_threads()}, f)
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        sys.stderr.write(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                  sys.argv[5] if len(sys.argv) == 6 else None))
