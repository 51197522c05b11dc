#!/usr/bin/python3
"""torch_ref.py: check Tessera's whole-model loss, gradients and one AdamW step
against an independent PyTorch model (correctness ladder, level 2).

    torch_ref.py DUMP.h5

DUMP.h5 comes from tests/ref/dump_ref: /model/<name> (initial fp32 weights), /grad/<name>
(Tessera's gradient of the mean loss), /after/<name> (weights after one AdamW step),
/batch/inputs and /batch/targets [B, T], and root attributes (loss, loss_after, lr,
grad_norm, model and optimizer numbers; document_mask and eos_id: with document masking
the inputs are split into documents at each end-of-document token, attention stays
inside a document and positions count from its first token).

The model here is written from docs/model.md alone and runs in
float64 (the reference) and float32 (to show how large plain fp32 roundoff is).
Errors are per tensor: max|tessera - ref| / max|ref| (see ZERO for the exception).
Exit 0 when every check is within TOL, 1 otherwise.
"""
import math
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

# fp32 carries ~7 digits; a 2-layer model with ~1e5 accumulations per gradient loses one
# or two of them, so 1e-5 of each tensor's largest value is the fp32 bar (docs/conventions.md "Correctness ladder").
TOL = 1e-5
# A few gradients are zero by symmetry, not by accident: softmax ignores a constant
# added to every score of a row, so the key bias (gpt2) gets exactly zero gradient in
# exact arithmetic and pure roundoff in floating point.  Roundoff measured against
# roundoff means nothing, so a tensor whose float64 gradient is below ZERO times the
# largest gradient of the model (zero to double precision) is judged on that largest
# gradient instead of its own (such tensors are listed).
ZERO = 1e-10


# ---------------------------------------------------------------- loading

def load(path):
    with h5py.File(path, "r") as f:
        attrs = {}
        for key, val in f.attrs.items():
            if isinstance(val, bytes):
                val = val.decode()
            elif isinstance(val, np.ndarray) and val.shape == ():
                val = val.item()
            elif isinstance(val, np.generic):
                val = val.item()
            attrs[key] = val
        groups = {}
        for g in ("model", "grad", "after"):
            groups[g] = {name: np.array(f[g][name]) for name in f[g].keys()} if g in f else {}
        inputs = np.array(f["batch/inputs"]).astype(np.int64)
        targets = np.array(f["batch/targets"]).astype(np.int64)
    return attrs, groups, inputs, targets


def make_params(tensors, dtype):
    return {name: torch.nn.Parameter(torch.tensor(arr, dtype=dtype))
            for name, arr in tensors.items()}


# ---------------------------------------------------------------- the model

def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def norm(cfg, P, prefix, x):
    if cfg["arch"] == "gpt2":
        return F.layer_norm(x, (x.shape[-1],), P[prefix + ".weight"], P[prefix + ".bias"],
                            cfg["norm_eps"])
    return rms_norm(x, P[prefix + ".weight"], cfg["norm_eps"])


def linear(P, prefix, x):
    return F.linear(x, P[prefix + ".weight"], P.get(prefix + ".bias"))


def llama3_scaled(freqs, cfg):
    """Llama 3.1's rescaling of RoPE's frequencies, as its reference code publishes it:
    per frequency, by its wavelength against the original context length."""
    factor, low = float(cfg["rope_factor"]), float(cfg["rope_low_freq_factor"])
    high, old_context = float(cfg["rope_high_freq_factor"]), float(cfg["rope_original_context"])
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(freq)
        elif wavelen > low_freq_wavelen:
            out.append(freq / factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float64)


def documents(cfg, inputs):
    """(positions [B, T], allowed [B, 1, T, T]) of the batch: without document masking
    position t and the causal mask; with it (docs/model.md "Document masking") a document
    is the tokens up to and including an end-of-document token, so the token after one
    starts the next document at position 0, and a query sees the keys of its own document
    at or before it.  A sequence's first tokens continue a document begun before it."""
    B, T = inputs.shape
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    if not cfg.get("document_mask", 0):
        return torch.arange(T).expand(B, T), causal.expand(B, 1, T, T)
    start = torch.zeros(B, T, dtype=torch.long)  # the first position of each token's document
    for b in range(B):
        s = 0
        for t in range(T):
            start[b, t] = s
            if int(inputs[b, t]) == cfg.get("eos_id", -1):
                s = t + 1
    positions = torch.arange(T)[None, :] - start
    same_doc = torch.arange(T)[None, None, :] >= start[:, :, None]  # [B, query, key]
    return positions, (causal[None] & same_doc)[:, None]


def rope(x, cfg, positions):
    """x [B, heads, T, h]; the pair (x[i], x[i+h/2]) is rotated by pos * theta^(-2i/h),
    pos = positions[b, t], that frequency rescaled first with rope_scaling = llama3."""
    h = x.shape[-1]
    half = h // 2
    i = torch.arange(half, dtype=torch.float64)
    inv_freq = cfg["rope_theta"] ** (-2.0 * i / h)
    if cfg.get("rope_scaling", "none") == "llama3":
        inv_freq = llama3_scaled(inv_freq, cfg)
    angle = positions.to(torch.float64)[:, None, :, None] * inv_freq  # [B, 1, T, half]
    cos = torch.cos(angle).to(x.dtype)
    sin = torch.sin(angle).to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(cfg, P, prefix, x, positions, allowed):
    B, T, C = x.shape
    H, KV = cfg["n_head"], cfg["n_kv_head"]
    hd = C // H
    q = linear(P, prefix + ".wq", x).view(B, T, H, hd).transpose(1, 2)
    k = linear(P, prefix + ".wk", x).view(B, T, KV, hd).transpose(1, 2)
    v = linear(P, prefix + ".wv", x).view(B, T, KV, hd).transpose(1, 2)
    if cfg["arch"] == "llama":
        q = rope(q, cfg, positions)
        k = rope(k, cfg, positions)
    # query head j reads KV head j // (H / KV)
    kv_of_head = torch.arange(H) // (H // KV)
    k = k[:, kv_of_head]
    v = v[:, kv_of_head]
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(~allowed, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # [B, H, T, hd]
    y = y.transpose(1, 2).reshape(B, T, H * hd)
    return linear(P, prefix + ".wo", y)


def mlp(cfg, P, prefix, x):
    if cfg["arch"] == "gpt2":
        return linear(P, prefix + ".w_down", gelu_tanh(linear(P, prefix + ".w_up", x)))
    gate = linear(P, prefix + ".w_gate", x)
    up = linear(P, prefix + ".w_up", x)
    return linear(P, prefix + ".w_down", F.silu(gate) * up)


def logits_fn(cfg, P, inputs):
    """The logits [B, T, V] of inputs [B, T]."""
    positions, allowed = documents(cfg, inputs)
    x = P["embed.weight"][inputs]
    if cfg["arch"] == "gpt2":
        x = x + P["pos_embed.weight"][positions]
    for layer in range(cfg["n_layer"]):
        p = "layers.%03d." % layer
        x = x + attention(cfg, P, p + "attn", norm(cfg, P, p + "attn_norm", x), positions, allowed)
        x = x + mlp(cfg, P, p + "mlp", norm(cfg, P, p + "mlp_norm", x))
    x = norm(cfg, P, "final_norm", x)
    head = P["embed.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    return F.linear(x, head)


def loss_fn(cfg, P, inputs, targets):
    B, T = inputs.shape
    logits = logits_fn(cfg, P, inputs)
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def expected_names(cfg):
    gpt2 = cfg["arch"] == "gpt2"
    names = ["embed.weight"] + (["pos_embed.weight"] if gpt2 else [])
    for layer in range(cfg["n_layer"]):
        p = "layers.%03d." % layer
        norms = ["attn_norm", "mlp_norm"]
        lins = ["attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w_up", "mlp.w_down"]
        if not gpt2:
            lins.append("mlp.w_gate")
        for n in norms:
            names.append(p + n + ".weight")
            if gpt2:
                names.append(p + n + ".bias")
        for n in lins:
            names.append(p + n + ".weight")
            if gpt2:
                names.append(p + n + ".bias")
    names.append("final_norm.weight")
    if gpt2:
        names.append("final_norm.bias")
    if not cfg["tie_embeddings"]:
        names.append("lm_head.weight")
    return sorted(names)


# ---------------------------------------------------------------- optimizer

def adamw_step(cfg, P, lr):
    """One torch.optim.AdamW step on P's .grad, clipped first like the trainer.
    Returns the global gradient norm before clipping."""
    params = list(P.values())
    if cfg["grad_clip"] > 0:
        norm_before = float(torch.nn.utils.clip_grad_norm_(params, max_norm=cfg["grad_clip"]))
    else:
        norm_before = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)))
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    opt.step()
    return norm_before


# ---------------------------------------------------------------- comparison

def rel_err(got, ref, floor=0.0):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return math.inf
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, floor, 1e-30)
    return float(np.max(np.abs(got - ref))) / scale if ref.size else 0.0


def scale_of(ref, big):
    """The error scale of a tensor: its largest value, or `big` where that is ~0."""
    m = float(np.max(np.abs(ref))) if ref.size else 0.0
    return big if m < ZERO * big else m


def worst(tess, ref, big=0.0):
    """(worst relative error, tensor name, tensors judged on `big`)."""
    errs = {n: rel_err(tess[n], ref[n], scale_of(ref[n], big)) for n in ref}
    name = max(errs, key=errs.get)
    zeros = [n for n in ref if scale_of(ref[n], big) != float(np.max(np.abs(ref[n])))]
    return errs[name], name, zeros


def grads_of(P):
    return {n: p.grad.detach().double().numpy().copy() for n, p in P.items()}


def main(path):
    attrs, groups, inputs_np, targets_np = load(path)
    cfg = dict(attrs)
    cfg.setdefault("document_mask", 0)
    cfg.setdefault("eos_id", -1)
    for key in ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "vocab_size", "seq_len",
                "tie_embeddings", "document_mask", "eos_id"):
        cfg[key] = int(cfg[key])
    for key in ("rope_theta", "norm_eps", "grad_clip", "beta1", "beta2", "eps", "weight_decay",
                "lr", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                "rope_original_context"):
        if key in cfg:
            cfg[key] = float(cfg[key])
    inputs = torch.from_numpy(inputs_np)
    targets = torch.from_numpy(targets_np)
    ok = True

    def check(what, err, detail=""):
        nonlocal ok
        passed = err <= TOL  # False for NaN
        ok = ok and passed
        print("  %-34s %.3e  %s %s" % (what, err, "ok  " if passed else "FAIL", detail))

    print("torch_ref: %s  arch=%s L=%d C=%d H=%d KV=%d F=%d V=%d T=%d B=%d tied=%d recompute=%s"
          % (path, cfg["arch"], cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["n_kv_head"],
             cfg["d_ff"], cfg["vocab_size"], cfg["seq_len"], inputs.shape[0],
             cfg["tie_embeddings"], cfg.get("recompute", "?")))
    if cfg.get("document_mask", 0):
        eos = inputs == cfg.get("eos_id", -1)
        print("  document masking: end-of-document id %d; %d documents begin in the %d sequences "
              "(%s per sequence), %d sequences end one on their last token"
              % (cfg.get("eos_id", -1), int(eos[:, :-1].sum()), inputs.shape[0],
                 ", ".join(str(int(n)) for n in eos[:, :-1].sum(dim=1)), int(eos[:, -1].sum())))
        if int(eos[:, :-1].sum()) == 0:
            print("  FAIL: document masking on, but no document begins inside a sequence")
            return 1

    names = expected_names(cfg)
    for g in ("model", "grad", "after"):
        if sorted(groups[g]) != names:
            missing = sorted(set(names) - set(groups[g]))
            extra = sorted(set(groups[g]) - set(names))
            print("  FAIL: /%s tensors differ from docs/model.md's names: missing %s, unexpected %s"
                  % (g, missing, extra))
            return 1
        for n in names:
            if groups[g][n].shape != groups["model"][n].shape:
                print("  FAIL: /%s/%s has shape %s, /model has %s"
                      % (g, n, groups[g][n].shape, groups["model"][n].shape))
                return 1

    # ---- forward + backward, float64 (reference) and float32 (roundoff yardstick)
    P64 = make_params(groups["model"], torch.float64)
    loss64 = loss_fn(cfg, P64, inputs, targets)
    loss64.backward()
    P32 = make_params(groups["model"], torch.float32)
    loss32 = loss_fn(cfg, P32, inputs, targets)
    loss32.backward()
    g64, g32, gt = grads_of(P64), grads_of(P32), groups["grad"]
    gmax = max(float(np.max(np.abs(a))) for a in g64.values())

    print("  loss: tessera %.9f  torch64 %.9f  torch32 %.9f"
          % (cfg["loss"], float(loss64), float(loss32)))
    check("loss rel err (tessera vs f64)", abs(cfg["loss"] - float(loss64)) / abs(float(loss64)),
          "[torch32 vs f64: %.2e]" % (abs(float(loss32) - float(loss64)) / abs(float(loss64))))
    err, name, zeros = worst(gt, g64, gmax)
    err32, name32, _ = worst(g32, g64, gmax)
    check("grad max rel err (tessera vs f64)", err,
          "worst %s [torch32 vs f64: %.2e at %s]" % (name, err32, name32))
    for n in zeros:
        print("    %-32s max|ref| %.2e: zero by symmetry, judged on the largest gradient %.2e"
              % (n, np.max(np.abs(g64[n])), gmax))
    if err > TOL:
        for n in names:
            e = rel_err(gt[n], g64[n], scale_of(g64[n], gmax))
            if e > TOL:
                print("    %-32s rel err %.3e  max|ref| %.3e  max|tessera| %.3e"
                      % (n, e, np.max(np.abs(g64[n])), np.max(np.abs(gt[n]))))

    # ---- one AdamW step.  (1) from Tessera's own gradients: checks clipping and AdamW
    # exactly.  (2) from the float64 reference gradients: the independent end-to-end
    # path, used for the loss after the step.  Elementwise (2) is ill-posed where a
    # gradient is ~0: Adam's first step is lr * g / (|g| + eps) ~ lr * sign(g), and the
    # sign of a roundoff-sized g is arbitrary, so (2) leaves those elements out.
    Pt = make_params(groups["model"], torch.float64)
    for n, p in Pt.items():
        p.grad = torch.tensor(gt[n], dtype=torch.float64)
    norm_t = adamw_step(cfg, Pt, cfg["lr"])
    after_t = {n: p.detach().numpy() for n, p in Pt.items()}
    norm64 = adamw_step(cfg, P64, cfg["lr"])
    after64 = {n: p.detach().numpy() for n, p in P64.items()}

    clip = cfg["grad_clip"] if cfg["grad_clip"] > 0 else "off"
    print("  step: lr %.6e  grad_norm tessera %.9e  torch64 %.9e  clip %s"
          % (cfg["lr"], cfg["grad_norm"], norm64, clip))
    check("grad_norm rel err (tessera vs f64)", abs(cfg["grad_norm"] - norm64) / norm64)
    check("grad_norm rel err (same grads)", abs(cfg["grad_norm"] - norm_t) / norm_t)
    err, name, _ = worst(groups["after"], after_t)
    check("after-step params (same grads)", err, "worst %s" % name)
    if err > TOL:
        for n in names:
            e = rel_err(groups["after"][n], after_t[n])
            if e > TOL:
                print("    %-32s rel err %.3e" % (n, e))
    # (2) elementwise, on the elements whose update the gradient check pins down.  At
    # step 1, AdamW moves p by lr * u(g), u(g) = g / (|g| + eps) (m and sqrt(v) are both
    # |g| after bias correction).  The gradient check allows an error d = TOL * scale in
    # g (after clipping by c), which moves u by up to d * eps / (|g| - d + eps)^2 and can
    # flip its sign when |g| <= d.  Elements where that could exceed TOL / 10 of the
    # tensor's size are left out (and counted); exact zeros (embedding rows of tokens
    # absent from the batch) stay in, as only weight decay moves them.
    c = min(1.0, cfg["grad_clip"] / (norm64 + 1e-6)) if cfg["grad_clip"] > 0 else 1.0
    err2, name2, skipped, total = 0.0, names[0], 0, 0
    for n in names:
        ref = after64[n]
        size = max(float(np.max(np.abs(ref))), 1e-30)
        d = c * TOL * scale_of(g64[n], gmax)
        cg = c * np.abs(g64[n])
        with np.errstate(divide="ignore"):
            du = np.where(cg > d, d * cfg["eps"] / np.maximum(cg - d + cfg["eps"], 1e-300) ** 2,
                          np.inf)
        sure = (cfg["lr"] * du <= 0.1 * TOL * size) | ((g64[n] == 0) & (gt[n] == 0))
        skipped += int(np.count_nonzero(~sure))
        total += sure.size
        diff = np.abs(groups["after"][n].astype(np.float64) - ref)[sure]
        e = float(np.max(diff)) / size if sure.any() else 0.0
        if not np.all(np.isfinite(groups["after"][n])):
            e = math.inf
        if e > err2:
            err2, name2 = e, n
    check("after-step params (f64 grads)", err2,
          "worst %s; %d of %d elements left out (see comment)" % (name2, skipped, total))
    moved = max(float(np.max(np.abs(after64[n] - groups["model"][n]))) for n in names)
    print("  largest parameter change in the step: %.3e" % moved)

    with torch.no_grad():
        loss_after64 = float(loss_fn(cfg, P64, inputs, targets))
    print("  loss_after: tessera %.9f  torch64 %.9f  (loss moved by %.3e)"
          % (cfg["loss_after"], loss_after64, loss_after64 - float(loss64)))
    check("loss_after rel err (tessera vs f64)",
          abs(cfg["loss_after"] - loss_after64) / abs(loss_after64))

    print("torch_ref: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: torch_ref.py DUMP.h5\n")
        sys.exit(2)
    torch.manual_seed(0)
    sys.exit(main(sys.argv[1]))
