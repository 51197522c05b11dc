#!/usr/bin/env bash
# bench/plan_calibration.sh — tessera plan against published H100 runs: the Megatron-LM
# README's weak-scaling table (GPT 1.7B-462B, sequence 4096, 48-6144 GPUs) and llm.c's
# GPT-2 1558M on one 8 x H100 node.  Each run has a deck in bench/calibration/ with its
# published layout, batch and sequence length (the deck's header says where its numbers
# come from and what had to be assumed); the script plans it with --implementation
# reference, and tessera for comparison, and prints predicted against published.
#
#   bench/plan_calibration.sh [TESSERA] [--alternatives | --fit] [plan arguments ...]
#
#   (default)       the table, a few seconds
#   --alternatives  the pipeline rows again under the readings of the table the decks do
#                   not take: interleaving with one layer per chunk, and micro-batch 2
#   --fit           the grid search that chose the reference profile's fitted constants
#                   (gemm_efficiency, gemm_half_dim, tp_overlap, inter_node_efficiency):
#                   every combination planned on the rows not held out, ranked by the
#                   largest |log(predicted / published)|; 72 combinations, some 5 minutes
#                   on an idle 2-core machine
#   plan arguments  passed to every tessera plan (hardware.tp_overlap=0.5, ...)
#
# TFLOP/s per GPU are counted as each source counts them, so that the ratio is the ratio
# of step times: Megatron-LM's rows with its own formula (megatron/training/training.py,
# num_floating_point_operations: 12 B s l h^2 (1 + 1 + s/h + 4 + V / (2 l h)) for these
# models, whose attention counts the full square, not the causal half), llm.c's with
# Tessera's (6 N + 6 L T d per token, tsr_plan_flops_per_token) over its published 2.80 s
# step.  "ratio" = predicted / published TFLOP/s per GPU = published / predicted step
# time; the issue asks 0.85-1.15.  Rows marked "held out" took no part in the fit.
# Planning only: no timing here, nothing to lock.
set -euo pipefail
TESSERA=${1:-src/tessera}
shift || true
here=$(cd "$(dirname "$0")" && pwd)
exec /usr/bin/python3 - "$TESSERA" "$here/calibration" "$@" <<'PY'
import itertools, json, math, re, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

tessera, decks, args = sys.argv[1], sys.argv[2], sys.argv[3:]
mode = "table"
if args and args[0] in ("--fit", "--alternatives"):
    mode, args = args[0][2:], args[1:]
# published: TFLOP/s per GPU (Megatron-LM's table), or seconds per step (llm.c)
published = {
    "megatron_gpt_1p7b": 408.8, "megatron_gpt_7p1b": 465.9, "megatron_gpt_16b": 489.1,
    "megatron_gpt_32b": 459.6, "megatron_gpt_70b": 419.7, "megatron_gpt_119b": 420.5,
    "megatron_gpt_177b": 432.8, "megatron_gpt_314b": 474.4, "megatron_gpt_462b": 459.9,
}
LLMC, LLMC_STEP = "llmc_gpt2_1558m", 2.80
held_out = {"megatron_gpt_16b", "megatron_gpt_314b", LLMC}

def deck(name):
    return open(f"{decks}/{name}.nml").read()

def key(name, k):
    return int(re.search(rf"^\s*{k}\s*=\s*(\d+)", deck(name), re.M).group(1))

def megatron_flops(name):
    """Megatron-LM's count per step for these models (MHA, ffn 4h, no MoE)"""
    B, s, V = key(name, "global_batch"), key(name, "seq_len"), key(name, "vocab_size")
    l, h = key(name, "n_layer"), key(name, "d_model")
    return 12 * B * s * l * h * h * ((1 + 1 + s / h) + 4 + V / (2 * l * h))

def plan(name, impl, extra):
    nodes = re.search(r"--nodes (\d+)", deck(name)).group(1)
    cmd = [tessera, "plan", f"{decks}/{name}.nml", "--nodes", nodes, "--implementation", impl,
           "--json"] + args + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench/plan_calibration.sh: {' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)

def tflops(name, p):
    """(predicted, published) TFLOP/s per GPU, counted as the source counts"""
    world = p["machine"]["world"]
    if name == LLMC:
        flops = p["flops"]["model"]
        return flops / p["time"]["step_s"] / world / 1e12, flops / LLMC_STEP / world / 1e12
    return megatron_flops(name) / p["time"]["step_s"] / world / 1e12, published[name]

names = sorted(published, key=lambda n: key(n, "n_layer") * key(n, "d_model") ** 2) + [LLMC]
pool = ThreadPoolExecutor(2)

if mode == "table":
    plans = dict(zip(names, pool.map(lambda n: (plan(n, "reference", []),
                                                plan(n, "tessera", [])), names)))
    print(f"{'run':<20} {'GPUs':>5} {'tp':>3} {'pp':>3} {'dp':>4} {'m':>3} {'published':>9} "
          f"{'reference':>9} {'ratio':>6} {'tessera':>8} {'ratio':>6} {'ref MFU':>7}  note")
    worst = {True: 0.0, False: 0.0}
    for n in names:
        r, t = plans[n]
        lay = r["layout"]
        pr, pub = tflops(n, r)
        pt, _ = tflops(n, t)
        worst[n in held_out] = max(worst[n in held_out], abs(pr / pub - 1))
        note = ("held out" if n in held_out else "") + \
            (" MISSES 15%" if abs(pr / pub - 1) > 0.15 else "")
        print(f"{n:<20} {r['machine']['world']:>5} {lay['tp']:>3} {lay['pp']:>3} {lay['dp']:>4} "
              f"{lay['micro_batches']:>3} {pub:>9.1f} {pr:>9.1f} {pr / pub:>6.3f} {pt:>8.1f} "
              f"{pt / pub:>6.3f} {r['time']['mfu']:>7.3f}  {note}")
    print(f"largest |ratio - 1| with --implementation reference: {worst[False]:.3f} on the rows "
          f"the fit used, {worst[True]:.3f} on the rows held out")
elif mode == "alternatives":
    pipes = [n for n in names if n != LLMC and key(n, "pp") > 1]
    readings = {"1f1b, micro-batch 1 (the decks)": lambda n: [],
                "interleaved, one layer per chunk": lambda n: [
                    "parallel.schedule=interleaved",
                    f"parallel.virtual_stages={key(n, 'n_layer') // key(n, 'pp')}"],
                "1f1b, micro-batch 2": lambda n: ["train.micro_batch=2"]}
    print(f"{'reading of the table':<34} " + " ".join(f"{n[13:]:>6}" for n in pipes))
    for label, extra in readings.items():
        r = list(pool.map(lambda n: tflops(n, plan(n, "reference", extra(n))), pipes))
        print(f"{label:<34} " + " ".join(f"{p / q:6.3f}" for p, q in r))
else:  # fit
    grid = {"gemm_efficiency": [0.65, 0.7, 0.75, 0.8], "gemm_half_dim": [64, 128, 256],
            "tp_overlap": [0.5, 0.9, 1.0], "inter_node_efficiency": [0.85, 1.0]}
    used = [n for n in names if n not in held_out]
    rows = []
    for combo in itertools.product(*grid.values()):
        over = [f"hardware.{k}={v}" for k, v in zip(grid, combo)]
        r = list(pool.map(lambda n: tflops(n, plan(n, "reference", over)), used))
        worst = max(abs(math.log(p / q)) for p, q in r)
        rows.append((worst, combo, [p / q for p, q in r]))
        print(f"{worst:.3f} {dict(zip(grid, combo))}", flush=True, file=sys.stderr)
    rows.sort()
    print(" ".join(grid) + "  largest |log ratio|  ratios: " + " ".join(n[13:] for n in used))
    for worst, combo, ratios in rows[:10]:
        print(" ".join(f"{v:>{len(k)}}" for k, v in zip(grid, combo)) +
              f"  {worst:19.3f}  " + " ".join(f"{x:.3f}" for x in ratios))
PY
