#!/usr/bin/env python3
"""torch_gpu_llama.py: the PyTorch reference for Tessera's single-GPU throughput.

    torch_gpu_llama.py [STEPS] [WARMUP] [--compile]

Trains input/llama1b.nml's model (16 layers, d_model 2048, 32 heads of 64, 8 KV heads,
SwiGLU d_ff 5632, vocab 32000, seq 2048, untied head) on one GPU the way one would write
it for speed in PyTorch 2.x: fp32 parameters and AdamW state (fused AdamW), bf16 autocast
for the matrix products, F.scaled_dot_product_attention (flash attention), no activation
recompute, micro-batch 1, clip_grad_norm_(1.0).  Random tokens (the throughput does not
depend on them).  Prints one line per timed step, then

    torch: median ms/step M, tokens/s T, model TFLOP/s F, MFU U (peak P TFLOP/s)

with the FLOPs counted as Tessera's planner counts them (src/plan.c,
tsr_plan_flops_per_token: 6 x parameters, the token embedding counted as a matrix, + 6 x
n_layer x d_model x seq per token for causal attention's scores and values) and P the bf16 rate of an
8192^3 torch.matmul measured first in the same run (MFU against a measured GEMM rate, as
Tessera reports it).  Steps are timed with CUDA events around the whole step.
"""
import statistics
import sys

import torch
import torch.nn.functional as F

L, D, H, KV, FF, V, S = 16, 2048, 32, 8, 5632, 32000, 2048
HD = D // H


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n1 = torch.nn.RMSNorm(D, eps=1e-5)
        self.qkv = torch.nn.Linear(D, (H + 2 * KV) * HD, bias=False)
        self.o = torch.nn.Linear(D, D, bias=False)
        self.n2 = torch.nn.RMSNorm(D, eps=1e-5)
        self.gu = torch.nn.Linear(D, 2 * FF, bias=False)
        self.down = torch.nn.Linear(FF, D, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([H * HD, KV * HD, KV * HD], dim=-1)
        q = q.view(b, s, H, HD).transpose(1, 2)
        k = k.view(b, s, KV, HD).transpose(1, 2)
        v = v.view(b, s, KV, HD).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
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
        self.norm = torch.nn.RMSNorm(D, eps=1e-5)
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
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(10):
        t0.record()
        a @ b
        t1.record()
        t1.synchronize()
        ms.append(t0.elapsed_time(t1))
    return 2 * 8192**3 / (statistics.median(ms) * 1e-3)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    steps = int(args[0]) if args else 10
    warm = int(args[1]) if len(args) > 1 else 3
    dev = torch.device("cuda")
    torch.manual_seed(0)
    peak = gemm_peak(dev)
    model = Model().to(dev)
    n_par = sum(p.numel() for p in model.parameters())
    flops_tok = 6 * n_par + 6 * L * D * S
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    step_fn = model
    if "--compile" in sys.argv:
        step_fn = torch.compile(model)
    tok = torch.randint(0, V, (1, S + 1), device=dev)
    ms = []
    for i in range(warm + steps):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_fn(tok[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, V), tok[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1.record()
        t1.synchronize()
        if i >= warm:
            ms.append(t0.elapsed_time(t1))
            print(f"torch step {i - warm + 1}: {ms[-1]:.1f} ms, loss {loss.item():.4f}", flush=True)
    med = statistics.median(ms)
    tps = S / (med * 1e-3)
    print(f"torch{' (compiled)' if '--compile' in sys.argv else ''}: median ms/step {med:.1f}, "
          f"tokens/s {tps:.0f}, model TFLOP/s {tps * flops_tok / 1e12:.1f}, MFU "
          f"{tps * flops_tok / peak:.3f} (peak {peak / 1e12:.0f} TFLOP/s); "
          f"{n_par / 1e9:.3f} B params, max memory "
          f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
