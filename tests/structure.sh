#!/usr/bin/env bash
# structure.sh — the shape of the code, checked on the sources and the built objects:
#  1. no two objects of the libraries use symbols the other defines (nm on the members of
#     src/libtessera.a and, in a CUDA build, cuda/libtsr_cuda.a): the modules call each
#     other in one direction only;
#  2. no cycle among the headers' #include "..." lines;
#  3. every op of src/ops_list.h is named (its entry there; tsr_ops_<name>, tsr_cpu_<name>
#     or tsr_cuda_<name> elsewhere) under src/ and cuda/ only in the list, one CPU kernel
#     file, one CUDA file and the files that call it — never in the plumbing (ops.h, ops.c,
#     ops_backend.h, ops_cpu.h, cuda/backend.c, cuda/backend.h), which the list
#     generates — so a new op costs its entry, its two kernels and its call; the ops named
#     in more than 4 files (those called from more than one module) are listed;
#  4. the training loop stays a loop: src/train.c under 400 lines;
#  5. nothing in the project points at design texts outside it (../shared, DESIGN.md,
#     SHARDING.md, CONVENTIONS.md).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
command -v nm >/dev/null || skip "no nm"
command -v python3 >/dev/null || skip "no python3"
src=$top_srcdir bld=$top_builddir
scratch
[ -f "$bld/src/libtessera.a" ] || skip "no $bld/src/libtessera.a (build first)"

libs=("$bld/src/libtessera.a")
[ -f "$bld/cuda/libtsr_cuda.a" ] && libs+=("$bld/cuda/libtsr_cuda.a")
python3 - "${libs[@]}" >"$SCRATCH/circles.txt" 2>&1 <<'PY'
import itertools, subprocess, sys
defs, uses = {}, {}
for lib in sys.argv[1:]:
    # nm -A: "archive:member: [address] type symbol" for each member object of the library
    for line in subprocess.run(["nm", "-g", "-A", lib], capture_output=True, text=True).stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 3:
            continue
        o, p = parts[1], parts[2].split()
        d, u = defs.setdefault(o, set()), uses.setdefault(o, set())
        if len(p) >= 2 and p[-2] == "U":
            u.add(p[-1])
        elif len(p) >= 2 and p[-2] in "TDBRCVW":
            d.add(p[-1])
objs = sorted(defs)
bad = [(a, b) for a, b in itertools.combinations(objs, 2) if uses[a] & defs[b] and uses[b] & defs[a]]
for a, b in bad:
    print(f"    {a} <-> {b}: {sorted(uses[a] & defs[b])[:2]} / {sorted(uses[b] & defs[a])[:2]}")
print(f"    {len(objs)} objects in {len(sys.argv) - 1} libraries, {len(bad)} pairs that use each other")
sys.exit(1 if bad or len(objs) < 10 else 0)
PY
rc=$?
cat "$SCRATCH/circles.txt"
check "no two objects use each other's symbols" test $rc -eq 0

python3 - "$src" >"$SCRATCH/headers.txt" 2>&1 <<'PY'
import glob, os, re, sys
top = sys.argv[1]
files = glob.glob(f"{top}/src/*.h") + glob.glob(f"{top}/cuda/*.h") + glob.glob(f"{top}/cuda/*.cuh")
inc = {os.path.basename(f): set(re.findall(r'#include "([^"]+)"', open(f).read())) for f in files}
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
sys.exit(1 if cycles else 0)
PY
rc=$?
cat "$SCRATCH/headers.txt"
check "no #include cycle among the headers" test $rc -eq 0

python3 - "$src" >"$SCRATCH/ops.txt" 2>&1 <<'PY'
import glob, os, re, sys
top = sys.argv[1]
ops = re.findall(r"^TSR_OP(?:_RET)?\((?:[a-z ]+, )?([a-z0-9_]+),", open(f"{top}/src/ops_list.h").read(), re.M)
files = [f for f in glob.glob(f"{top}/src/*.[ch]") + glob.glob(f"{top}/cuda/*.[ch]") +
         glob.glob(f"{top}/cuda/*.cu") + glob.glob(f"{top}/cuda/*.cuh") + glob.glob(f"{top}/cuda/*.cpp")]
text = {f: open(f, errors="replace").read() for f in files}
plumbing = {"src/ops.h", "src/ops.c", "src/ops_backend.h", "src/ops_cpu.h", "cuda/backend.c",
            "cuda/backend.h"}
bad, more = [], []
for op in ops:
    pat = re.compile(r"(?<![A-Za-z0-9_])tsr_(?:ops|cpu|cuda)_" + op + r"(?![A-Za-z0-9_])")
    call = re.compile(r"(?<![A-Za-z0-9_])tsr_ops_" + op + r"\(")
    where = sorted(os.path.relpath(f, top) for f in files if pat.search(text[f]))
    where = ["src/ops_list.h"] + [f for f in where if f != "src/ops_list.h"]
    cpu = [f for f in where if f.startswith("src/cpu")]
    dev = [f for f in where if f.startswith("cuda/")]
    callers = [f for f in where[1:] if f not in cpu + dev]
    # every other file calls the op; none of the plumbing names it
    if len(cpu) != 1 or len(dev) != 1 or set(where) & plumbing or \
            not all(call.search(text[os.path.join(top, f)]) for f in callers) or not callers:
        bad.append(f"    {op}: {', '.join(where)}")
    elif len(where) > 4:
        more.append(f"    {op}: {len(where)} files, callers {', '.join(callers)}")
print("\n".join(bad + more))
print(f"    {len(ops)} ops: {len(ops) - len(more) - len(bad)} in 4 files or fewer, {len(more)} in more "
      f"(more than one calling module), {len(bad)} wrong")
sys.exit(1 if bad or not ops else 0)
PY
rc=$?
cat "$SCRATCH/ops.txt"
check "every op is named only in the list, one CPU file, one CUDA file and its callers" \
  test $rc -eq 0

n=$(wc -l <"$src/src/train.c")
check "src/train.c is the loop: $n lines (under 400)" test "$n" -lt 400

grep -rlE '\.\./shared|DESIGN\.md|SHARDING\.md|CONVENTIONS\.md' "$src/src" "$src/cuda" "$src/tools" \
  "$src/tests" "$src/jobs" "$src/bench" "$src/docs" "$src/README.md" --include='*' 2>/dev/null |
  grep -vE '\.(o|a|log|trs)$|tests/structure\.sh$' >"$SCRATCH/refs.txt"
cat "$SCRATCH/refs.txt"
check "nothing points at design texts outside the project" test ! -s "$SCRATCH/refs.txt"
finish
