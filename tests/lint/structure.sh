#!/usr/bin/env bash
# structure.sh — the shape of the code, checked on the sources and the built libraries
# (tests/lint/structure.py does each check; its docstring says what each one means):
#  1. the layers: src/ is one folder per layer, in Makefile.am's order (TSR_LAYERS, lowest
#     first; cuda/ is the device backend's layer); a file includes only its own folder's
#     headers and those of the layers below, and each layer's library links only
#     libraries below it;
#  2. no two objects of the libraries use each other's symbols; no cycle among the headers;
#  3. the pipeline schedules are descriptors: each schedule's deck word is named under src/
#     only in src/sched/ (its own file and the registry) and the deck schema;
#  4. every op of src/ops/ops_list.h is named only in the list, one CPU kernel file, one
#     CUDA file and the files that call it, never in the dispatch plumbing;
#  5. the training loop stays a loop: src/run/train.c under 400 lines;
#  6. nothing in the project points at design texts outside it.
# And that checks 1 and 3 can fail: each is run again on a copy of the sources with one
# violation planted (an include pointing up the layers; a schedule's word in the model).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
command -v nm >/dev/null || skip "no nm"
command -v python3 >/dev/null || skip "no python3"
src=$top_srcdir bld=$top_builddir
scratch
read -r -a LIBS <<<"$(MAKEFLAGS= make -s --no-print-directory -C "$bld" print-tsr-libs 2>/dev/null)"
[ ${#LIBS[@]} -gt 0 ] && [ -f "$bld/${LIBS[0]}" ] || skip "no built libraries in $bld (build first)"
libs=("${LIBS[@]/#/$bld/}")
[ -f "$bld/cuda/libtsr_cuda.a" ] && libs+=("$bld/cuda/libtsr_cuda.a")
py() { python3 "$src/tests/lint/structure.py" "$@" >"$SCRATCH/out.txt" 2>&1; local rc=$?; cat "$SCRATCH/out.txt"; return $rc; }

py "$src" layers-include
check "every include points down the layers (or within a folder)" test $? -eq 0
py "$src" layers-link "${libs[@]}"
check "every library links only layers below it" test $? -eq 0
py "$src" objects "${libs[@]}"
check "no two objects use each other's symbols" test $? -eq 0
py "$src" cycles
check "no #include cycle among the headers" test $? -eq 0
py "$src" schedules
check "schedules' deck words only in src/sched/ and the deck schema" test $? -eq 0
py "$src" ops
check "every op is named only in the list, one CPU file, one CUDA file and its callers" \
  test $? -eq 0

# the checks fail on a planted violation
plant() { rm -rf "$SCRATCH/tree"; mkdir -p "$SCRATCH/tree"; cp -r "$src/src" "$src/cuda" "$src/Makefile.am" "$SCRATCH/tree/"; }
plant
sed -i '0,/#include "util.h"/s//#include "util.h"\n#include "run\/session.h"/' "$SCRATCH/tree/src/core/util.c"
grep -q '"run/session.h"' "$SCRATCH/tree/src/core/util.c" || bad "planting an include in src/core/util.c"
python3 "$src/tests/lint/structure.py" "$SCRATCH/tree" layers-include >"$SCRATCH/plant1.txt" 2>&1
rc=$?
check "a planted include of run/session.h in src/core/util.c fails the layer check" \
  test $rc -eq 1 -a -n "$(grep 'src/core/util.c (layer core) includes "run/session.h"' "$SCRATCH/plant1.txt")"
plant
w=$(python3 -c "import re,glob,sys; print(sorted(re.findall(r'\.word\s*=\s*\"([^\"]+)\"', ''.join(open(f).read() for f in glob.glob(sys.argv[1] + '/src/sched/*.c'))))[-1])" "$src")
echo "/* under '$w' the head sits elsewhere */" >>"$SCRATCH/tree/src/model/model.c"
python3 "$src/tests/lint/structure.py" "$SCRATCH/tree" schedules >"$SCRATCH/plant2.txt" 2>&1
rc=$?
check "the word '$w' planted in src/model/model.c fails the schedule check" \
  test $rc -eq 1 -a -n "$(grep "'$w' outside the pipeline subsystem: src/model/model.c" "$SCRATCH/plant2.txt")"

n=$(wc -l <"$src/src/run/train.c")
check "src/run/train.c is the loop: $n lines (under 400)" test "$n" -lt 400

grep -rlE '\.\./shared|DESIGN\.md|SHARDING\.md|CONVENTIONS\.md' "$src/src" "$src/cuda" "$src/tools" \
  "$src/tests" "$src/jobs" "$src/bench" "$src/docs" "$src/README.md" --include='*' 2>/dev/null |
  grep -vE '\.(o|a|log|trs)$|tests/lint/structure\.(sh|py)$' >"$SCRATCH/refs.txt"
cat "$SCRATCH/refs.txt"
check "nothing points at design texts outside the project" test ! -s "$SCRATCH/refs.txt"
finish
