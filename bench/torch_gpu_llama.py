#!/usr/bin/env python3
"""torch_gpu_llama.py: the PyTorch reference for Tessera's single-GPU throughput.

    torch_gpu_llama.py [STEPS] [WARMUP] [--compile] [--batch B] [--tiny]

Trains input/llama1b.nml's model (16 layers, d_model 2048, 32 heads of 64, 8 KV heads,
SwiGLU d_ff 5632, vocab 32000, seq 2048, untied head) on one GPU the way one would write
it for speed in PyTorch 2.x: fp32 parameters and AdamW state (fused AdamW), bf16 autocast
for the matrix products, F.scaled_dot_product_attention (flash attention), no activation
recompute, micro-batch B (default 1), clip_grad_norm_(1.0).  Random tokens (the throughput
does not depend on them).  --tiny: a model of a few thousand parameters on the CPU, for the
device plan's rehearsal without a GPU (tools/gpu/window.sh --dry-run).  Prints one line per
timed step, then

    torch: median ms/step M, tokens/s T, model TFLOP/s F, MFU U (peak P TFLOP/s); ...

or, when the micro-batch does not fit the GPU's memory, "torch: out of memory at batch B"
and exit status 3.

with the FLOPs counted as Tessera's planner counts them (src/plan/plan.c,
tsr_plan_flops_per_token: 6 x parameters, the token embedding counted as a matrix, + 6 x
n_layer x d_model x seq per token for causal attention's scores and values) and P the bf16 rate of an
8192^3 torch.matmul measured first in the same run (MFU against a measured GEMM rate, as
Tessera reports it).  Steps are timed with CUDA events around the whole step.
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

L, D, H, KV, FF, V, S = 16, 2048, 32, 8, 5632, 32000, 2048
if "--tiny" in sys.argv:
    L, D, H, KV, FF, V, S = 1, 64, 4, 2, 128, 256, 32
HD = D // H


class _RMSNorm(torch.nn.Module):  # for a torch without torch.nn.RMSNorm (before 2.4)
    def __init__(self, d, eps):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


RMSNorm = getattr(torch.nn, "RMSNorm", _RMSNorm)
OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def sdpa(q, k, v):
    if not hasattr(F, "scaled_dot_product_attention"):  # torch 1.x: written out (--tiny)
        r = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
        s = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        return s.masked_fill(mask, float("-inf")).softmax(-1) @ v
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    except TypeError:  # a torch before 2.5: the KV heads repeated by hand
        r = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1),
                                              v.repeat_interleave(r, 1), is_causal=True)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n1 = RMSNorm(D, eps=1e-5)
        self.qkv = torch.nn.Linear(D, (H + 2 * KV) * HD, bias=False)
        self.o = torch.nn.Linear(D, D, bias=False)
        self.n2 = RMSNorm(D, eps=1e-5)
        self.gu = torch.nn.Linear(D, 2 * FF, bias=False)
        self.down = torch.nn.Linear(FF, D, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([H * HD, KV * HD, KV * HD], dim=-1)
        q = q.view(b, s, H, HD).transpose(1, 2)
        k = k.view(b, s, KV, HD).transpose(1, 2)
        v = v.view(b, s, KV, HD).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = sdpa(q, k, v)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, D))
        g, u = self.gu(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


def rope(x, cos, sin):  # half-split rotary embedding
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
        self.norm = RMSNorm(D, eps=1e-5)
        self.head = torch.nn.Linear(D, V, bias=False)
        inv = 1.0 / (10000.0 ** (torch.arange(0, HD // 2).float() * 2 / HD))
        ang = torch.outer(torch.arange(S).float(), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tok):
        x = self.emb(tok)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        return self.head(self.norm(x))


def gemm_peak(dev):
    n = 8192 if dev.type == "cuda" else 256
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    ms = []
    for _ in range(10):
        with Timer(dev) as t:
            a @ b
        ms.append(t.ms)
    return 2 * n**3 / (statistics.median(ms) * 1e-3)


class Timer:
    """CUDA events around the region on a GPU, the host clock on the CPU."""
    def __init__(self, dev):
        self.cuda = dev.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.t0, self.t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.t0.record()
        else:
            self.h0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.t1.record()
            self.t1.synchronize()
            self.ms = self.t0.elapsed_time(self.t1)
        else:
            self.ms = (time.perf_counter() - self.h0) * 1e3


def main():
    argv = sys.argv[1:]
    batch = 1
    if "--batch" in argv:
        i = argv.index("--batch")
        batch = int(argv[i + 1])
        del argv[i:i + 2]
    args = [a for a in argv if not a.startswith("--")]
    steps = int(args[0]) if args else 10
    warm = int(args[1]) if len(args) > 1 else 3
    dev = torch.device("cpu" if "--tiny" in sys.argv else "cuda")
    torch.manual_seed(0)
    peak = gemm_peak(dev)
    model = Model().to(dev)
    n_par = sum(p.numel() for p in model.parameters())
    flops_tok = 6 * n_par + 6 * L * D * S
    kw = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **kw)
    step_fn = model
    if "--compile" in sys.argv:
        step_fn = torch.compile(model)
    tok = torch.randint(0, V, (batch, S + 1), device=dev)
    ms = []
    try:
        for i in range(warm + steps):
            with Timer(dev) as t:
                with torch.autocast(dev.type, dtype=torch.bfloat16):
                    logits = step_fn(tok[:, :-1])
                loss = F.cross_entropy(logits.float().view(-1, V), tok[:, 1:].reshape(-1))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
            if i >= warm:
                ms.append(t.ms)
                print(f"torch step {i - warm + 1}: {ms[-1]:.1f} ms, loss {loss.item():.4f}", flush=True)
    except OOM:
        print(f"torch: out of memory at batch {batch}", flush=True)
        sys.exit(3)
    med = statistics.median(ms)
    tps = batch * S / (med * 1e-3)
    mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0.0
    print(f"torch{' (compiled)' if '--compile' in sys.argv else ''}: median ms/step {med:.1f}, "
          f"tokens/s {tps:.0f}, model TFLOP/s {tps * flops_tok / 1e12:.1f}, MFU "
          f"{tps * flops_tok / peak:.3f} (peak {peak / 1e12:.0f} TFLOP/s); "
          f"{n_par / 1e9:.3f} B params, batch {batch}, max memory {mem:.1f} GiB")


if __name__ == "__main__":
    main()
