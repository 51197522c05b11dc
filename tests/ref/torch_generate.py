#!/usr/bin/python3
"""torch_generate.py: greedy decoding by an independent PyTorch model from a checkpoint.

    torch_generate.py CKPT.h5 CONTEXT EXPECTED [--vocab N]

CKPT.h5 is a Tessera checkpoint: /model/<name> holds the fp32 weights in their logical
shapes, whatever parallel layout wrote them, and the root attribute "deck" the effective
deck with the model's numbers.  CONTEXT and EXPECTED are token ids separated by spaces or
commas: the context `tessera generate` started from (its start token, then the prompt's
ids) and the ids it printed with --temperature 0 --ids.  The model is tests/ref/torch_ref.py's,
in float64.  For each token it runs the context, left-truncated to seq_len, and takes the
largest logit of the last position among ids below --vocab (default: all), appending it.
Each token is printed with the gap between its two largest logits: a gap near float32
roundoff would explain a difference (it is reported, and still fails).
Exit 0 when every token agrees, 1 otherwise, 2 on unusable input.
"""
import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ckpt import InputError, parse_deck, read_checkpoint  # noqa: E402
from torch_ref import logits_fn, make_params  # noqa: E402


def ids_of(text):
    return [int(t) for t in re.split(r"[\s,]+", text.strip()) if t]


def main(args):
    attrs, groups = read_checkpoint(args.ckpt)
    deck = parse_deck(attrs["deck"])
    cfg = {k.split(".", 1)[1]: v for k, v in deck.items() if k.startswith("model.")}
    cfg["tie_embeddings"] = int(cfg["tie_embeddings"])
    cfg["rope_theta"], cfg["norm_eps"] = float(cfg["rope_theta"]), float(cfg["norm_eps"])
    ctx, expected = ids_of(args.context), ids_of(args.expected)
    if not ctx or not expected:
        raise InputError("empty context or expected ids")
    vocab = args.vocab or cfg["vocab_size"]
    T = cfg["seq_len"]
    P = make_params(groups["model"], torch.float64)
    print("torch_generate: %s (step %s) arch=%s L=%d C=%d V=%d T=%d; context %d ids, %d to "
          "check" % (args.ckpt, attrs.get("step"), cfg["arch"], cfg["n_layer"], cfg["d_model"],
                     cfg["vocab_size"], T, len(ctx), len(expected)))
    ok = True
    with torch.no_grad():
        for i, want in enumerate(expected):
            window = torch.tensor([ctx[-T:]], dtype=torch.int64)
            row = logits_fn(cfg, P, window)[0, -1, :vocab]
            top = torch.topk(row, 2)
            got = int(top.indices[0])
            gap = float(top.values[0] - top.values[1]) / max(float(top.values[0].abs()), 1e-30)
            same = got == want
            ok = ok and same
            print("  token %2d: torch %5d  tessera %5d  %s  (relative gap to the runner-up %.2e%s)"
                  % (i, got, want, "ok" if same else "DIFFER", gap,
                     ", within float32 roundoff" if gap < 1e-5 else ""))
            ctx.append(got)
    print("torch_generate: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("context")
    ap.add_argument("expected")
    ap.add_argument("--vocab", type=int, default=0)
    try:
        sys.exit(main(ap.parse_args()))
    except (InputError, KeyError, OSError, ValueError) as e:
        print("torch_generate: FAIL: %s" % e)
        sys.exit(2)
