#!/usr/bin/env python3
"""structure.py TOP CHECK [LIB...] — one check of the shape of the code (tests/lint/structure.sh).

The layers are Makefile.am's TSR_LAYERS, lowest first: each is a folder of src/ (cuda: the
top-level cuda/).  src/main.c sits above them all.

  layers-include   a file of a layer includes only headers of its own folder (by bare name)
                   and of the layers below it (by "layer/name.h"); a bare name that is not in
                   its own folder, or a folder above, is a violation
  layers-link      LIB... are the built libraries (src/<layer>/libtsr_<layer>.a, cuda's): no
                   library uses a symbol that only a library of a higher layer defines
  objects          LIB...: no two member objects use each other's symbols
  cycles           no cycle among the headers' includes
  schedules        the pipeline schedules' deck words (the registry, src/sched/) appear under
                   src/ only in src/sched/ and in the deck schema; and each in at most 3 files
  ops              every op of ops_list.h is named only in the list, one CPU kernel file,
                   one CUDA file and the files that call it, never in the dispatch plumbing
Prints what it found; exits 1 on a violation.
"""
import glob
import itertools
import os
import re
import subprocess
import sys

top, what, libs = sys.argv[1], sys.argv[2], sys.argv[3:]


def layers():
    text = open(f"{top}/Makefile.am").read()
    m = re.search(r"^TSR_LAYERS\s*=\s*(.*)$", text, re.M)
    return m.group(1).split()


LAYERS = layers()
RANK = {name: i for i, name in enumerate(LAYERS)}


def layer_of(path):
    """The layer of a source path relative to top, or None (src/main.c: above all)."""
    parts = path.split("/")
    if parts[0] == "cuda":
        return "cuda"
    if parts[0] == "src" and len(parts) == 3:
        return parts[1]
    return None


def sources():
    pats = ["src/*/*.c", "src/*/*.h", "src/*/*.cc", "src/main.c",
            "cuda/*.c", "cuda/*.h", "cuda/*.cu", "cuda/*.cuh", "cuda/*.cpp"]
    out = []
    for p in pats:
        out += [os.path.relpath(f, top) for f in glob.glob(f"{top}/{p}")]
    return sorted(set(out))


def includes(path):
    return re.findall(r'^\s*#\s*include\s+"([^"]+)"', open(f"{top}/{path}", errors="replace").read(), re.M)


def check_layers_include():
    bad, n = [], 0
    headers = {os.path.relpath(f, top) for f in glob.glob(f"{top}/src/*/*.h")}
    for f in sources():
        me = layer_of(f)
        here = os.path.dirname(f)
        for inc in includes(f):
            n += 1
            if "/" in inc:
                folder = inc.split("/")[0]
                if folder not in RANK or not os.path.exists(f"{top}/src/{inc}"):
                    bad.append(f"{f}: includes \"{inc}\", not a header of a layer")
                elif me is not None and RANK[folder] >= RANK[me] and folder != me:
                    bad.append(f"{f} (layer {me}) includes \"{inc}\" of layer {folder}, above it")
            else:
                if os.path.exists(f"{top}/{here}/{inc}"):
                    continue
                if inc == "tsr_build.h" or inc.endswith(".in"):
                    bad.append(f"{f}: includes \"{inc}\" by bare name (\"core/{inc}\")")
                    continue
                owner = [h for h in headers if os.path.basename(h) == inc]
                if owner:
                    bad.append(f"{f}: includes \"{inc}\" of {os.path.dirname(owner[0])} by bare name")
                # anything else is outside the tree (the build's own headers, emu/include)
    for b in bad:
        print("    " + b)
    print(f"    {n} includes in {len(sources())} files of {len(LAYERS)} layers "
          f"({' < '.join(LAYERS)}), {len(bad)} pointing up or sideways")
    return not bad


def nm(lib):
    """{member: (defined, undefined)} of a static library."""
    defs, uses = {}, {}
    out = subprocess.run(["nm", "-g", "-A", lib], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 3:
            continue
        o, p = parts[1], parts[2].split()
        d, u = defs.setdefault(o, set()), uses.setdefault(o, set())
        if len(p) >= 2 and p[-2] == "U":
            u.add(p[-1])
        elif len(p) >= 2 and p[-2] in "TDBRCVW":
            d.add(p[-1])
    return defs, uses


def lib_layer(lib):
    parts = os.path.normpath(lib).split(os.sep)
    if "cuda" in parts[-2:-1]:
        return "cuda"
    return parts[-2]


def check_layers_link():
    table = {}
    for lib in libs:
        defs, uses = nm(lib)
        table[lib_layer(lib)] = (set().union(*defs.values()) if defs else set(),
                                 set().union(*uses.values()) if uses else set())
    bad = []
    for a, (_, ua) in table.items():
        for b, (db, _) in table.items():
            if a == b:
                continue
            s = sorted(ua & db)
            if s and RANK[b] > RANK[a]:
                bad.append(f"layer {a} links {len(s)} symbols of layer {b} above it: {s[:3]}")
    for b in bad:
        print("    " + b)
    print(f"    {len(table)} libraries, {len(bad)} links pointing up")
    # every layer's library was read: all but cli (linked with main.c by itself) and cuda
    # (built only with a CUDA toolkit)
    missing = [l for l in LAYERS if l not in table and l not in ("cli", "cuda")]
    for l in missing:
        print(f"    no library of layer {l} was given")
    return not bad and not missing


def check_objects():
    defs, uses = {}, {}
    for lib in libs:
        d, u = nm(lib)
        for o in d:
            defs[f"{os.path.basename(lib)}:{o}"], uses[f"{os.path.basename(lib)}:{o}"] = d[o], u[o]
    objs = sorted(defs)
    bad = [(a, b) for a, b in itertools.combinations(objs, 2)
           if uses[a] & defs[b] and uses[b] & defs[a]]
    for a, b in bad:
        print(f"    {a} <-> {b}: {sorted(uses[a] & defs[b])[:2]} / {sorted(uses[b] & defs[a])[:2]}")
    print(f"    {len(objs)} objects in {len(libs)} libraries, {len(bad)} pairs that use each other")
    return not bad and len(objs) >= 10


def check_cycles():
    files = [f for f in sources() if f.endswith((".h", ".cuh"))]
    def resolve(f, inc):
        if "/" in inc:
            return f"src/{inc}"
        return f"{os.path.dirname(f)}/{inc}"
    inc = {f: {resolve(f, i) for i in includes(f)} for f in files}
    cycles, state = [], {}
    def visit(n, path):
        state[n] = 1
        for m in sorted(inc.get(n, ())):
            if m not in inc:
                continue
            if state.get(m) == 1:
                cycles.append(path[path.index(m):] + [m])
            elif not state.get(m):
                visit(m, path + [m])
        state[n] = 2
    for n in sorted(inc):
        if not state.get(n):
            visit(n, [n])
    for c in cycles:
        print("    cycle: " + " -> ".join(c))
    print(f"    {len(inc)} headers, {len(cycles)} include cycles")
    return not cycles


def schedule_words():
    """The deck words of the registered schedules: each schedule file under src/sched/
    fills a descriptor whose .word is its deck word."""
    words = []
    for f in sorted(glob.glob(f"{top}/src/sched/*.c")):
        words += re.findall(r'\.word\s*=\s*"([^"]+)"', open(f).read())
    return words


def check_schedules():
    words = schedule_words()
    if not words:
        print("    no schedule descriptors found under src/sched/")
        return False
    files = [f for f in sources() if f.startswith("src/")]
    text = {f: open(f"{top}/{f}", errors="replace").read() for f in files}
    bad, counts = [], []
    for w in words:
        pat = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(w) + r"(?![A-Za-z0-9_])", re.I)
        where = [f for f in files if pat.search(text[f])]
        outside = [f for f in where if not f.startswith("src/sched/") and f != "src/deck/deck_schema.c"]
        if outside:
            bad.append(f"'{w}' outside the pipeline subsystem: {', '.join(outside)}")
        if len(where) > 3:
            bad.append(f"'{w}' in {len(where)} files (at most 3): {', '.join(where)}")
        counts.append(f"{w} {len(where)}")
    for b in bad:
        print("    " + b)
    print(f"    {len(words)} schedules, files naming each under src/: {', '.join(counts)}")
    return not bad


def check_ops():
    ops = re.findall(r"^TSR_OP(?:_RET)?\((?:[a-z ]+, )?([a-z0-9_]+),",
                     open(f"{top}/src/ops/ops_list.h").read(), re.M)
    files = [f for f in sources() if not f.endswith(".cc")]
    text = {f: open(f"{top}/{f}", errors="replace").read() for f in files}
    plumbing = {"src/ops/ops.h", "src/ops/ops.c", "src/ops/ops_backend.h", "src/cpu/ops_cpu.h",
                "src/cpu/cpu.c", "cuda/backend.c", "cuda/backend.h"}
    bad, more = [], []
    for op in ops:
        pat = re.compile(r"(?<![A-Za-z0-9_])tsr_(?:ops|cpu|cuda)_" + op + r"(?![A-Za-z0-9_])")
        call = re.compile(r"(?<![A-Za-z0-9_])tsr_ops_" + op + r"\(")
        where = sorted(f for f in files if pat.search(text[f]))
        where = ["src/ops/ops_list.h"] + [f for f in where if f != "src/ops/ops_list.h"]
        cpu = [f for f in where if f.startswith("src/cpu/")]
        dev = [f for f in where if f.startswith("cuda/")]
        callers = [f for f in where[1:] if f not in cpu + dev]
        if len(cpu) != 1 or len(dev) != 1 or set(where) & plumbing or \
                not all(call.search(text[f]) for f in callers) or not callers:
            bad.append(f"    {op}: {', '.join(where)}")
        elif len(where) > 4:
            more.append(f"    {op}: {len(where)} files, callers {', '.join(callers)}")
    print("\n".join(bad + more))
    print(f"    {len(ops)} ops: {len(ops) - len(more) - len(bad)} in 4 files or fewer, {len(more)} in "
          f"more (more than one calling module), {len(bad)} wrong")
    return not bad and bool(ops)


checks = {"layers-include": check_layers_include, "layers-link": check_layers_link,
          "objects": check_objects, "cycles": check_cycles, "schedules": check_schedules,
          "ops": check_ops}
sys.exit(0 if checks[what]() else 1)
