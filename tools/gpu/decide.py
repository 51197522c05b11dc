#!/usr/bin/env python3
"""decide.py — the device plan's arithmetic (tools/gpu/window.sh), standard library only.

    decide.py agree A B TOL         two runs' metrics.jsonl: every step's loss within TOL
                                    (relative), gradient norm within 10 TOL; exit 1 if not
    decide.py curve A B STEPS       a GPU run A tracks the CPU run B over STEPS 16-bit steps:
                                    every loss within 2%, the median gradient-norm
                                    difference under 10%
    decide.py steps RUN SKIP MB T   a training run's timing: the median step time of the
                                    steps after the first SKIP, tokens/s at micro-batch MB
                                    and T tokens a sequence, memory; as key=value words
    decide.py summary FILE...       the decisions from result files (window.sh's lines):
                                    printed, one block

A result line is a kind and key=value words (shell quoting for values with spaces):
    llama attn=mma mb=1 step_ms=48.0 tok_s=42700 mem_gb=21.2 cudnn=0 rc=0
The decisions are the ones bench/RESULTS.md ("What that run decides") sets out:
 1. nothing counts unless the kernel tests and the trainer's checks against the CPU pass
    (and compute-sanitizer is clean, where it ran);
 2. cuDNN is the default 16-bit attention where the build has it: confirmed when
    llama1b's shape ran on it and its losses held against the CPU;
 3. our own tensor-core attention is the mma.sync family (the WMMA one was removed): its
    llama1b step time against cuDNN's, at every micro-batch both ran, is reported;
 4. llama1b's tokens/s against PyTorch eager and torch.compile in the same call, and MFU.
"""
import json
import shlex
import statistics
import sys

# H100 SXM's dense bf16 tensor-core rate (the datasheet's 1979 TFLOP/s is with sparsity)
H100_BF16_DENSE = 989.4e12


def load_metrics(path):
    rows = [json.loads(line) for line in open(path)]
    return {r["step"]: r for r in rows if "loss" in r}


def agree(a, b, tol):
    ra, rb = load_metrics(a), load_metrics(b)
    if sorted(ra) != sorted(rb) or not ra:
        print(f"    steps differ: {sorted(ra)} vs {sorted(rb)}")
        return 1
    rel = lambda x, y: abs(x - y) / max(abs(y), 1e-30)
    dl = max(rel(ra[s]["loss"], rb[s]["loss"]) for s in ra)
    dg = max(rel(ra[s]["grad_norm"], rb[s]["grad_norm"]) for s in ra)
    print(f"    {len(ra)} steps: loss {rb[min(rb)]['loss']:.5f} -> {rb[max(rb)]['loss']:.5f}; "
          f"worst relative difference: loss {dl:.1e}, grad norm {dg:.1e} (tolerance {tol:g})")
    print(f"RESULT loss_rel={dl:.2e} grad_rel={dg:.2e}")
    return 0 if dl <= tol and dg <= 10 * tol else 1


def curve(a, b, steps):
    ra, rb = load_metrics(a), load_metrics(b)
    if sorted(ra) != sorted(rb) or len(ra) < steps:
        print(f"    steps differ or too few: {len(ra)} vs {len(rb)} (want {steps})")
        return 1
    rel = lambda x, y: abs(x - y) / abs(y)
    dl = max(rel(ra[s]["loss"], rb[s]["loss"]) for s in ra)
    dg = statistics.median(rel(ra[s]["grad_norm"], rb[s]["grad_norm"]) for s in ra)
    print(f"    {len(ra)} steps: loss {rb[min(rb)]['loss']:.4f} -> GPU {ra[max(ra)]['loss']:.4f}, "
          f"CPU {rb[max(rb)]['loss']:.4f}; worst loss difference {dl:.1e}, median grad norm "
          f"difference {dg:.1e}")
    print(f"RESULT loss_rel={dl:.2e} grad_median_rel={dg:.2e}")
    return 0 if dl <= 2e-2 and dg <= 0.1 else 1


def steps(run, skip, mb, seq):
    r = load_metrics(run + "/metrics.jsonl")
    ms = [r[s]["step_ms"] for s in sorted(r) if s > skip]
    if not ms:
        print("steps=0")
        return 1
    med = statistics.median(ms)
    mem = max(r[s].get("mem_bytes") or 0 for s in r) / 2**30
    own = statistics.median(r[s]["mfu"] for s in sorted(r) if s > skip)
    print(f"steps={len(ms)} step_ms={med:.2f} step_ms_min={min(ms):.2f} step_ms_max={max(ms):.2f} "
          f"tok_s={mb * seq / (med / 1e3):.0f} mem_gb={mem:.2f} mfu_own={own:.3f}")
    return 0


def parse(files):
    rows = []
    for f in files:
        for line in open(f):
            w = shlex.split(line)
            if not w or "=" in w[0]:
                continue
            d = {"kind": w[0]}
            for kv in w[1:]:
                if "=" in kv:
                    k, v = kv.split("=", 1)
                    d[k] = v
            rows.append(d)
    return rows


def num(d, k, default=None):
    try:
        return float(d[k])
    except (KeyError, ValueError, TypeError):
        return default


def summary(files):
    rows = parse(files)
    of = lambda kind: [r for r in rows if r["kind"] == kind]
    out = []
    say = out.append
    info = of("gpu")
    card = info[-1].get("name", "?") if info else "?"
    say(f"card: {card}; tree {info[-1].get('tree', '?') if info else '?'}")

    # 1. the gate
    problems = []
    for k in of("kernels"):
        if num(k, "failed", 1) != 0 or k.get("rc") != "0":
            problems.append(f"kernel tests: {k.get('passed', '?')} passed, {k.get('failed', '?')} "
                            f"failed, exit {k.get('rc')}")
    if not of("kernels"):
        problems.append("kernel tests did not run")
    for k in of("cp_blocks"):  # context parallelism's block ops (a subset of the above)
        # (their failures fail the kernel tests' gate; a rehearsal runs none of them)
        say(f"context parallelism's attention blocks and merge on the device: "
            f"{k.get('passed', '?')} checks passed, {k.get('failed', '?')} failed")
    checks = of("check")
    bad = [c["name"] for c in checks if c.get("ok") != "1"]
    if bad:
        problems.append("trainer checks failed: " + ", ".join(bad))
    if not checks:
        problems.append("the trainer checks did not run")
    for s in of("sanitizer"):
        if num(s, "errors", 1) != 0 or s.get("finished") != "1":
            problems.append(f"compute-sanitizer {s.get('tool')}: {s.get('errors')} errors, "
                            f"finished {s.get('finished')}"
                            + (f" ({s['checks_run']} checks run, {s.get('races_seen')} races "
                               f"reported before it was cut)" if "checks_run" in s else ""))
    for p in of("part"):
        if p.get("name") in ("kernels", "train", "memcheck", "racecheck") and (
                p.get("rc") != "0" or p.get("skipped")):
            problems.append(f"part {p['name']} did not finish ("
                            + (f"skipped: {p['skipped']}" if p.get("skipped") else
                               f"exit {p.get('rc')}") + ")")
    gate = not problems
    say("gate (kernel tests, trainer against the CPU, sanitizers where run): " +
        ("PASS" if gate else "FAIL: " + "; ".join(problems)))
    say(f"  {len(checks)} trainer checks, {sum(c.get('ok') == '1' for c in checks)} passed; "
        + "; ".join(f"{k.get('passed')} kernel checks passed, {k.get('failed')} failed"
                    for k in of("kernels")))

    # llama1b runs
    llama = [r for r in of("llama") if r.get("rc") == "0" and num(r, "step_ms")
             and not r.get("offload") and not r.get("act_offload")]
    best = {}
    for r in llama:
        key = (r["attn"], int(num(r, "mb")))
        if key not in best or num(r, "step_ms") < num(best[key], "step_ms"):
            best[key] = r
    for (a, mb), r in sorted(best.items(), key=lambda x: (x[0][1], x[0][0])):
        say(f"  llama1b {a:5s} mb {mb:2d}: {num(r, 'step_ms'):8.1f} ms/step, "
            f"{num(r, 'tok_s'):8.0f} tokens/s, {num(r, 'mem_gb', 0):5.1f} GiB"
            + (f", ran: {r.get('ran')}" if r.get("ran") else ""))
    # the optimizer and activation offloads against the same run without (docs/offload.md)
    for r in of("llama"):
        if not (r.get("offload") or r.get("act_offload")) or r.get("rc") != "0" \
                or not num(r, "step_ms"):
            continue
        base = best.get((r["attn"], int(num(r, "mb"))))
        ms = num(r, "step_ms")
        what = f"offload={r['offload']}" if r.get("offload") else "act_offload=1"
        say(f"RESULT {what} llama1b {r['attn']} mb {r.get('mb')}: {ms:.1f} ms/step, "
            f"{num(r, 'mem_gb', 0):.1f} GiB"
            + (f"; without it {num(base, 'step_ms'):.1f} ms, {num(base, 'mem_gb', 0):.1f} GiB: "
               f"{ms - num(base, 'step_ms'):+.1f} ms, "
               f"{num(r, 'mem_gb', 0) - num(base, 'mem_gb', 0):+.1f} GiB" if base else
               "; no run without it to compare"))
    for r in of("llama"):
        if r.get("rc") != "0":
            say(f"  llama1b {r.get('attn')} mb {r.get('mb')}"
                + (f" offload {r['offload']}" if r.get("offload") else "")
                + (" act_offload" if r.get("act_offload") else "") + f": exit {r.get('rc')} "
                f"({r.get('why', 'see its log')})")

    # 2. cuDNN
    cud = [r for (a, mb), r in best.items() if a == "cudnn" and r.get("cudnn") == "1"]
    cud_checks = [c for c in checks if "cudnn" in c["name"]]
    cud_ok = bool(cud_checks) and all(c.get("ok") == "1" for c in cud_checks)
    if not gate:
        say("DECISION cudnn_default: not taken (the gate failed)")
    elif cud and cud_ok:
        say(f"DECISION cudnn_default: yes (llama1b ran on cuDNN's fused attention; "
            f"{len(cud_checks)} cuDNN checks against the CPU held)")
    else:
        why = ("llama1b did not run on cuDNN" if not cud else
               "cuDNN's losses against the CPU did not hold" if cud_checks else
               "no cuDNN check against the CPU ran")
        say(f"DECISION cudnn_default: no ({why})")

    # 3. cuDNN against our mma.sync kernels, at every micro-batch both ran
    for mb in sorted(m for (a, m) in best if a == "cudnn" and ("mma", m) in best):
        c, o = num(best[("cudnn", mb)], "step_ms"), num(best[("mma", mb)], "step_ms")
        say(f"RESULT cudnn/mma step time mb {mb}: {c / o:.2f} (cuDNN {c:.1f} ms, our mma.sync "
            f"{o:.1f} ms, {(o - c) / c * 100:+.1f}% against cuDNN)")

    # 4. against PyTorch
    torch = [r for r in of("torch") if r.get("rc") == "0" and num(r, "tok_s")]
    peak = max((num(r, "peak_tflops", 0) for r in torch), default=0) * 1e12
    fpt = max((num(r, "flops_per_token", 0) for r in of("model")), default=0)
    for mode in ("eager", "compile"):
        for t in sorted((r for r in torch if r.get("mode") == mode), key=lambda r: num(r, "mb")):
            mb = int(num(t, "mb"))
            ours = [r for (a, m), r in best.items() if m == mb]
            if not ours:
                say(f"  torch {mode} mb {mb}: {num(t, 'tok_s'):.0f} tokens/s (no Tessera run at mb {mb})")
                continue
            o = max(ours, key=lambda r: num(r, "tok_s"))
            say(f"RESULT tessera/torch_{mode} mb {mb}: {num(o, 'tok_s') / num(t, 'tok_s'):.2f} "
                f"(Tessera {o['attn']} {num(o, 'tok_s'):.0f} tokens/s, PyTorch {mode} "
                f"{num(t, 'tok_s'):.0f})")
    if fpt and best:
        o = max(best.values(), key=lambda r: num(r, "tok_s"))
        rate = num(o, "tok_s") * fpt
        say(f"RESULT MFU: {rate / H100_BF16_DENSE:.3f} of an H100 SXM's dense bf16 989 TFLOP/s"
            + (f", {rate / peak:.3f} of the 8192^3 bf16 product measured in the call "
               f"({peak / 1e12:.0f} TFLOP/s)" if peak else "")
            + f" (Tessera {o['attn']} mb {o['mb']}, {fpt / 1e9:.2f} GFLOP per token, the "
              f"planner's count)")
    for t in of("torch"):
        if t.get("rc") != "0":
            say(f"  torch {t.get('mode')} mb {t.get('mb')}: exit {t.get('rc')}"
                + (" (out of memory)" if t.get("rc") == "3" else ""))
    for p in of("part"):
        if p.get("rc") not in ("0", None):
            say(f"  part {p.get('name')}: exit {p.get('rc')}"
                + (" (timed out)" if p.get("rc") in ("124", "137") else ""))
        if p.get("skipped"):
            say(f"  part {p.get('name')}: skipped ({p.get('skipped')})")
    print("\n".join(out))
    return 0


def main(argv):
    if len(argv) >= 4 and argv[1] == "agree":
        return agree(argv[2], argv[3], float(argv[4]) if len(argv) > 4 else 1e-5)
    if len(argv) == 5 and argv[1] == "curve":
        return curve(argv[2], argv[3], int(argv[4]))
    if len(argv) == 6 and argv[1] == "steps":
        return steps(argv[2], int(argv[3]), int(argv[4]), int(argv[5]))
    if len(argv) >= 3 and argv[1] == "summary":
        return summary(argv[2:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
