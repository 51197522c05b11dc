#!/usr/bin/python3
"""torch_ckpt.py: the reviewer's check, from public artefacts only.

    torch_ckpt.py RUN_DIR [--data GLOB]

RUN_DIR is a finished `tessera` run (run.out_dir) with data.shuffle = .false.,
checkpoint.save_initial = .true. and checkpoints kept for steps 0 and 1.  Read:
  RUN_DIR/ckpt/step_00000000.h5  initial weights (/model/...) and the effective deck
                                 (root attribute "deck"), which gives every model,
                                 batch, schedule and optimizer number used here;
  RUN_DIR/ckpt/step_00000001.h5  weights and Adam moments after one update;
  RUN_DIR/metrics.jsonl          loss, lr and grad_norm of steps 1 and 2;
  the token shards of &data train (or --data GLOB), read with our own header parser.
Nothing of Tessera's code is used.  The model is tests/ref/torch_ref.py's (written from
docs/model.md), run in float64.  Step s (1-based) uses global samples (s-1)*global_batch ..
s*global_batch - 1, sample k being stream tokens [k*seq_len, k*seq_len + seq_len]
(docs/formats.md, "Token stream and samples"); the loss is the mean over all B*T targets of the batch.

Checks (each prints the measured figure; tolerances explained at TOL in torch_ref.py):
  lr of steps 1, 2      the documented schedule vs metrics "lr"
  loss of step 1        float64 model on samples 0..7 vs metrics "loss"
  grad_norm of step 1   float64 global L2 norm vs metrics "grad_norm"
  Adam m, v of step 1   (1-b1)*c*g and (1-b2)*(c*g)^2 (c = clip scale) vs /optim/m, /optim/v
  AdamW arithmetic      step-0 weights + the checkpoint's own m, v vs step-1 weights
  after-step weights    torch.optim.AdamW on the float64 gradients vs step-1 weights
                        (elements with a ~0 gradient left out, as in torch_ref.py)
  loss of step 2        samples 8..15 under the torch-updated weights vs metrics "loss",
                        and under the checkpoint's step-1 weights (forward only)
Exit 0 when every check passes, 1 otherwise, 2 on unusable input.
"""
import argparse
import glob
import json
import math
import os
import struct
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import (TOL, adamw_step, expected_names, loss_fn,  # noqa: E402
                       make_params, rel_err, scale_of)

# Both sides compute the schedule in double; only the printing (17 digits) and a
# different but equivalent expression order separate them.
LR_TOL = 1e-12

SHARD_MAGIC = b"TSRTOK01"
SHARD_HEADER = struct.Struct("<8sIIQ232s")  # magic, token_bytes, vocab_size, n_tokens, name


class InputError(Exception):
    pass


# ---------------------------------------------------------------- public artefacts

def parse_deck(text):
    """The effective deck as Tessera echoes it: `&group`, `key = value` lines, `/`.
    Returns {"group.key": value} with strings, bools, ints and floats."""
    deck, group = {}, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("!"):
            continue
        if line.startswith("&"):
            group = line[1:].split()[0].lower()
            continue
        if line == "/":
            group = None
            continue
        if group is None or "=" not in line:
            raise InputError("deck attribute: cannot read line %r" % raw)
        key, val = (s.strip() for s in line.split("=", 1))
        deck[group + "." + key.lower()] = parse_value(val)
    return deck


def parse_value(val):
    if val.startswith("'") or val.startswith('"'):
        q = val[0]
        if len(val) < 2 or not val.endswith(q):
            raise InputError("deck attribute: unterminated string %r" % val)
        return val[1:-1].replace(q + q, q)
    low = val.lower()
    if low in (".true.", "t", ".t."):
        return True
    if low in (".false.", "f", ".f."):
        return False
    try:
        return int(val)
    except ValueError:
        pass
    try:
        return float(low.replace("d", "e"))
    except ValueError:
        raise InputError("deck attribute: cannot read value %r" % val) from None


def read_checkpoint(path):
    if not os.path.isfile(path):
        raise InputError("%s not found (run with checkpoint.save_initial=.true., "
                         "checkpoint.every_steps=1 and keep >= 3)" % path)
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        groups = {}
        for g in ("model", "optim/m", "optim/v"):
            groups[g] = {n: np.array(f[g][n]) for n in f[g].keys()} if g in f else {}
    return attrs, groups


def read_metrics(path):
    steps = {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if "loss" in d:
                steps[d["step"]] = d  # appended across restarts: the last line wins
    return steps


def read_stream(pattern, n_tokens, vocab):
    """The first n_tokens of the concatenated shards matching pattern (sorted order)."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise InputError("no token shards match %r" % pattern)
    parts, have = [], 0
    for p in paths:
        with open(p, "rb") as f:
            head = f.read(SHARD_HEADER.size)
            if len(head) != SHARD_HEADER.size:
                raise InputError("%s: short header" % p)
            magic, token_bytes, shard_vocab, count, _name = SHARD_HEADER.unpack(head)
            if magic != SHARD_MAGIC or token_bytes not in (2, 4):
                raise InputError("%s: not a TSRTOK01 shard with 2- or 4-byte tokens" % p)
            if shard_vocab > vocab:
                raise InputError("%s: vocab %d > model vocab %d" % (p, shard_vocab, vocab))
            take = min(count, n_tokens - have)
            dtype = "<u2" if token_bytes == 2 else "<u4"
            tok = np.frombuffer(f.read(take * token_bytes), dtype=dtype)
            if tok.size != take:
                raise InputError("%s: truncated" % p)
            parts.append(tok.astype(np.int64))
            have += take
        if have == n_tokens:
            return np.concatenate(parts), paths.index(p) + 1
    raise InputError("%r holds %d tokens, fewer than the %d needed" % (pattern, have, n_tokens))


def batch(stream, seq_len, first, count):
    """Samples first .. first+count-1 as (inputs, targets) [count, seq_len]."""
    rows = np.stack([stream[k * seq_len: k * seq_len + seq_len + 1]
                     for k in range(first, first + count)])
    return torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())


def scheduled_lr(deck, step):
    """docs/model.md / optim.h: linear warmup, then decay over decay_steps (0 = max_steps)."""
    lr, min_lr = deck["optim.lr"], deck["optim.min_lr"]
    warmup, decay = deck["optim.warmup_steps"], deck["optim.decay"]
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    total = deck["optim.decay_steps"] or deck["run.max_steps"]
    if decay == "constant" or total <= warmup:
        return lr
    p = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    if decay == "linear":
        return lr + (min_lr - lr) * p
    if decay == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * p))
    if decay == "wsd":
        frac = deck["optim.wsd_decay_frac"]
        return lr if p <= 1.0 - frac else lr + (min_lr - lr) * (p - (1.0 - frac)) / frac
    raise InputError("unknown optim.decay %r" % decay)


def expected_shape(cfg, name):
    C, V, T, Fd = cfg["d_model"], cfg["vocab_size"], cfg["seq_len"], cfg["d_ff"]
    hd = C // cfg["n_head"]
    q, kv = cfg["n_head"] * hd, cfg["n_kv_head"] * hd
    short = name.split(".", 2)[-1] if name.startswith("layers.") else name
    shapes = {"embed.weight": (V, C), "pos_embed.weight": (T, C), "lm_head.weight": (V, C),
              "attn.wq.weight": (q, C), "attn.wk.weight": (kv, C), "attn.wv.weight": (kv, C),
              "attn.wo.weight": (C, q), "mlp.w_gate.weight": (Fd, C),
              "mlp.w_up.weight": (Fd, C), "mlp.w_down.weight": (C, Fd),
              "attn.wq.bias": (q,), "attn.wk.bias": (kv,), "attn.wv.bias": (kv,),
              "attn.wo.bias": (C,), "mlp.w_up.bias": (Fd,), "mlp.w_down.bias": (C,)}
    return shapes.get(short, (C,))  # norms: weight and bias [d_model]


# ---------------------------------------------------------------- the check

def main(run_dir, data_glob):
    a0, c0 = read_checkpoint(os.path.join(run_dir, "ckpt", "step_00000000.h5"))
    a1, c1 = read_checkpoint(os.path.join(run_dir, "ckpt", "step_00000001.h5"))
    metrics = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    if 1 not in metrics or 2 not in metrics:
        raise InputError("metrics.jsonl lacks the step 1 and 2 lines (run.max_steps >= 2)")
    deck = parse_deck(a0["deck"])
    if deck["data.shuffle"]:
        raise InputError("the run used data.shuffle=.true.; this check needs the plain order")
    if deck["train.precision"] != "fp32":
        raise InputError("the run used precision %r; this check is for fp32"
                         % deck["train.precision"])
    cfg = {k.split(".", 1)[1]: v for k, v in deck.items()
           if k.split(".")[0] in ("model", "train", "optim")}
    cfg["tie_embeddings"] = int(cfg["tie_embeddings"])
    for k in ("rope_theta", "norm_eps", "grad_clip", "beta1", "beta2", "eps", "weight_decay"):
        cfg[k] = float(cfg[k])
    T, GB = cfg["seq_len"], cfg["global_batch"]
    ok = True

    def check(what, err, tol, detail=""):
        nonlocal ok
        passed = err <= tol  # False for NaN
        ok = ok and passed
        print("%s: %-40s %.3e (tol %.0e)  %s" % ("PASS" if passed else "FAIL", what, err, tol,
                                                 detail))

    print("torch_ckpt: %s  arch=%s L=%d C=%d H=%d KV=%d F=%d V=%d T=%d global_batch=%d "
          "micro_batch=%d tied=%d clip=%g"
          % (run_dir, cfg["arch"], cfg["n_layer"], cfg["d_model"], cfg["n_head"],
             cfg["n_kv_head"], cfg["d_ff"], cfg["vocab_size"], T, GB, cfg["micro_batch"],
             cfg["tie_embeddings"], cfg["grad_clip"]))

    names = expected_names(cfg)
    for tag, groups in (("step 0", c0), ("step 1", c1)):
        for g in (("model",) if tag == "step 0" else ("model", "optim/m", "optim/v")):
            if sorted(groups[g]) != names:
                print("FAIL: %s /%s names differ from docs/model.md: missing %s, unexpected %s"
                      % (tag, g, sorted(set(names) - set(groups[g])),
                         sorted(set(groups[g]) - set(names))))
                return 1
            bad = [n for n in names if groups[g][n].shape != expected_shape(cfg, n)]
            if bad:
                print("FAIL: %s /%s/%s has shape %s, docs/model.md says %s"
                      % (tag, g, bad[0], groups[g][bad[0]].shape, expected_shape(cfg, bad[0])))
                return 1
    print("PASS: checkpoint tensors: %d names and shapes as in docs/model.md (steps 0 and 1; "
          "attrs step %s, %s)" % (len(names), a0.get("step"), a1.get("step")))

    pattern = data_glob or deck["data.train"]
    stream, n_shards = read_stream(pattern, 2 * GB * T + 1, cfg["vocab_size"])
    print("  data: %s: first %d tokens from %d shard(s); step 1 = samples 0..%d, "
          "step 2 = samples %d..%d" % (pattern, stream.size, n_shards, GB - 1, GB, 2 * GB - 1))
    x1, y1 = batch(stream, T, 0, GB)
    x2, y2 = batch(stream, T, GB, GB)

    # ---- schedule
    lr1, lr2 = scheduled_lr(deck, 1), scheduled_lr(deck, 2)
    for s, lr in ((1, lr1), (2, lr2)):
        got = metrics[s]["lr"]
        check("lr step %d (schedule vs metrics)" % s, abs(got - lr) / abs(lr), LR_TOL,
              "metrics %.17g  schedule %.17g (%s, warmup %d)"
              % (got, lr, deck["optim.decay"], deck["optim.warmup_steps"]))

    # ---- step 1: loss and gradient in float64
    P = make_params(c0["model"], torch.float64)
    loss1 = loss_fn(cfg, P, x1, y1)
    loss1.backward()
    g64 = {n: p.grad.detach().numpy().copy() for n, p in P.items()}
    gmax = max(float(np.max(np.abs(a))) for a in g64.values())
    got = metrics[1]["loss"]
    check("loss step 1 (samples 0..%d)" % (GB - 1), abs(got - float(loss1)) / abs(float(loss1)),
          TOL, "tessera %.12f  torch64 %.12f" % (got, float(loss1)))

    # ---- one AdamW step: torch.optim.AdamW after clip_grad_norm_, as docs/model.md says
    norm = adamw_step(cfg, P, lr1)
    after = {n: p.detach().numpy() for n, p in P.items()}
    got = metrics[1]["grad_norm"]
    check("grad_norm step 1", abs(got - norm) / norm, TOL,
          "tessera %.12f  torch64 %.12f" % (got, norm))
    c = min(1.0, cfg["grad_clip"] / (norm + 1e-6)) if cfg["grad_clip"] > 0 else 1.0
    print("  clip scale %.9f  lr %.9e  beta1 %g  beta2 %g  eps %g  weight_decay %g (2-D only)"
          % (c, lr1, cfg["beta1"], cfg["beta2"], cfg["eps"], cfg["weight_decay"]))

    # Adam's moments after the first step are (1-b1)*c*g and (1-b2)*(c*g)^2, so the
    # checkpoint gives Tessera's clipped gradient without any other channel.  ZERO as in
    # torch_ref.py: tensors zero by symmetry are judged on the largest value of the model.
    m_ref = {n: (1 - cfg["beta1"]) * c * g64[n] for n in names}
    v_ref = {n: (1 - cfg["beta2"]) * (c * g64[n]) ** 2 for n in names}
    for key, ref in (("optim/m", m_ref), ("optim/v", v_ref)):
        big = max(float(np.max(np.abs(a))) for a in ref.values())
        errs = {n: rel_err(c1[key][n], ref[n], scale_of(ref[n], big)) for n in names}
        worst = max(errs, key=errs.get)
        zeros = [n for n in names if scale_of(ref[n], big) != float(np.max(np.abs(ref[n])))]
        check("Adam %s step 1 (clipped grad)" % key.split("/")[1], errs[worst], TOL,
              "worst %s%s" % (worst, "; judged on the largest: %s" % ", ".join(zeros)
                              if zeros else ""))

    # AdamW arithmetic alone: the update from the checkpoint's own m and v, all elements.
    b1c, b2c = 1 - cfg["beta1"], 1 - cfg["beta2"]
    errs = {}
    for n in names:
        p0 = c0["model"][n].astype(np.float64)
        wd = cfg["weight_decay"] if p0.ndim == 2 else 0.0
        m, v = c1["optim/m"][n].astype(np.float64), c1["optim/v"][n].astype(np.float64)
        pred = p0 * (1 - lr1 * wd) - lr1 * (m / b1c) / (np.sqrt(v / b2c) + cfg["eps"])
        errs[n] = rel_err(c1["model"][n], pred)
    worst = max(errs, key=errs.get)
    check("AdamW from the checkpoint's m, v", errs[worst], TOL, "worst %s" % worst)

    # End to end: torch's update from the float64 gradients.  Where a gradient is ~0 the
    # first AdamW step lr*g/(|g|+eps) ~ lr*sign(g) is decided by roundoff, so those
    # elements are left out exactly as in torch_ref.py: the m check above allows an error
    # d = TOL*scale in c*g, which moves the update by up to lr*d*eps/(|cg|-d+eps)^2;
    # elements where that could exceed TOL/10 of the tensor's size are not judged.  Exact
    # zeros (embedding rows of absent tokens, m == 0 in the checkpoint) stay in.
    err2, name2, left_out, total = 0.0, names[0], 0, 0
    for n in names:
        ref = after[n]
        size = max(float(np.max(np.abs(ref))), 1e-30)
        d = c * TOL * scale_of(g64[n], gmax)
        cg = c * np.abs(g64[n])
        with np.errstate(divide="ignore"):
            du = np.where(cg > d, d * cfg["eps"] / np.maximum(cg - d + cfg["eps"], 1e-300) ** 2,
                          np.inf)
        sure = (lr1 * du <= 0.1 * TOL * size) | ((g64[n] == 0) & (c1["optim/m"][n] == 0))
        left_out += int(np.count_nonzero(~sure))
        total += sure.size
        got = c1["model"][n].astype(np.float64)
        e = float(np.max(np.abs(got - ref)[sure])) / size if sure.any() else 0.0
        if not np.all(np.isfinite(got)):
            e = math.inf
        if e > err2:
            err2, name2 = e, n
    check("step-1 weights (torch AdamW, f64 grads)", err2, TOL,
          "worst %s; %d of %d elements left out (~0 gradient)" % (name2, left_out, total))
    moved = max(float(np.max(np.abs(after[n] - c0["model"][n]))) for n in names)
    print("  largest parameter change in step 1: %.3e" % moved)

    # ---- step 2: the loss on samples GB..2GB-1 before the second update
    with torch.no_grad():
        loss2 = float(loss_fn(cfg, P, x2, y2))
        loss2_ck = float(loss_fn(cfg, make_params(c1["model"], torch.float64), x2, y2))
    got = metrics[2]["loss"]
    check("loss step 2 (torch-updated weights)", abs(got - loss2) / abs(loss2), TOL,
          "tessera %.12f  torch64 %.12f" % (got, loss2))
    check("loss step 2 (checkpoint step-1 weights)", abs(got - loss2_ck) / abs(loss2_ck), TOL,
          "tessera %.12f  torch64 %.12f" % (got, loss2_ck))

    print("torch_ckpt: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--data", help="token shard glob (default: the deck's data.train)")
    args = ap.parse_args()
    try:
        sys.exit(main(args.run_dir, args.data))
    except (InputError, KeyError, OSError) as e:
        print("torch_ckpt: FAIL: %s" % e)
        sys.exit(2)
