#!/usr/bin/env bash
# deck_mutations.sh — input/tiny.nml mutated line by line, each mutation run through the
# trainer as a user would run it: every run must end with exit code 2 (bad input; the
# scratch directory has no data, so a deck that is still valid stops at its data.train glob)
# and a `deck.nml:LINE:COL: ` error, never a crash, an abort, another code or a hang (10 s
# each).  A misspelt key, a value of the wrong type and a bad value of a key are also
# located on the line that was changed.  The mutations: each key misspelt, given twice,
# without its '=', its value replaced by values of the wrong type, out of range, empty
# ('' and nothing), unterminated and too long; groups renamed, unclosed and closed twice.
# Then command-line overrides of the same kinds (located as `<command line>:argN:COL`; a
# micro_batch of 10^12 once printed its error and then spun for hours suggesting another;
# an empty data.train, or one file that is not there, was reported without its place),
# and layouts that do not divide under `mpirun -np 2` and `-np 4`.
# Exit 0 pass, 1 fail, 77 skip (no binary).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
[ -x "$TESSERA" ] || skip "no $TESSERA"
scratch
T=$(cd "$(dirname "$TESSERA")" && pwd)/$(basename "$TESSERA")
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# ---- the deck, mutated line by line: one directory per mutation ----
"$PYTHON_REF" - "$top_srcdir/input/tiny.nml" "$SCRATCH/m" <<'EOF'
import os, re, sys
src, out = sys.argv[1], sys.argv[2]
lines = open(src).read().split("\n")
kv = re.compile(r"^(\s*)([a-z_0-9]+)(\s*=\s*)([^!]*?)(\s*(!.*)?)$")
# values of the wrong type or range, empty, unterminated, too long: each key gets the next
# one in turn, and every string key gets the empty string and its value unquoted
vals = ["0", "-1", "1.5", "99999999999999999999", "1e400", "'x'", ".true.", "'abc", "",
        "2*4", "nan", "1, 2", "'" + "x" * 5000 + "'", "'data/*[.bin'", "2147483648", "'a\tb'"]
muts = []  # (line index, new text, must the error be on that line)
vi = 0
for i, l in enumerate(lines):
    m = kv.match(l)
    if l.strip().startswith("&"):
        muts.append((i, l.replace("&", "&x"), True) if i % 2 else (i, l.replace("&", ""), False))
    elif l.strip() == "/":
        muts.append((i, "", False) if i % 2 else (i, "//", False))
    elif m:
        ind, k, eq, v, com = m.group(1), m.group(2), m.group(3), m.group(4), m.group(5) or ""
        typo = k[:1] + k[2] + k[1] + k[3:] if len(k) > 3 and k[1] != k[2] else k + "x"
        muts.append((i, ind + typo + eq + v + com, True))
        muts.append((i, l + "\n" + l, False) if i % 2 else (i, ind + k + " " + v + com, False))
        muts.append((i, ind + k + eq + vals[vi % len(vals)] + com, False))
        vi += 1
        if v.startswith("'"):
            muts.append((i, ind + k + eq + "''" + com, False))
            muts.append((i, ind + k + eq + v[1:-1] + com, True))
for n, (i, new, here) in enumerate(muts):
    d = os.path.join(out, "%03d" % n)
    os.makedirs(d)
    ls = list(lines)
    ls[i] = new
    open(os.path.join(d, "deck.nml"), "w").write("\n".join(ls))
    open(os.path.join(d, "what"), "w").write("%d %d %s\n" % (i + 1, here, new.split("\n")[0][:70]))
EOF
n=$(ls "$SCRATCH/m" | wc -l)
# one run per directory, four at a time (most of a run is waiting for MPI's start); each leaves its exit code in rc
ls "$SCRATCH/m" | xargs -P 4 -I{} sh -c \
  'cd "$1/{}" && timeout -k 5 10 "$2" deck.nml >log.txt 2>&1; echo $? >rc' _ "$SCRATCH/m" "$T"
bad_runs=0
for d in "$SCRATCH"/m/*; do
  read -r line here what <"$d/what"
  rc=$(cat "$d/rc")
  want="deck\.nml:[0-9]+:[0-9]+: "
  [ "$here" = 1 ] && want="deck\.nml:$line:[0-9]+: "
  if [ "$rc" != 2 ] || ! grep -Eq "$want" "$d/log.txt"; then
    bad_runs=$((bad_runs + 1))
    echo "    line $line: '$what': exit $rc, wanted 2 and /$want/"
    sed 's/^/        /' "$d/log.txt" | tail -4
  fi
done
check "$n mutations of input/tiny.nml: each exits 2 with deck.nml:line:col ($bad_runs did not)" \
  test "$bad_runs" -eq 0

# ---- command-line overrides: located as <command line>:argN:COL ----
D=$(cd "$top_srcdir/input" && pwd)/tiny.nml
mkdir -p "$SCRATCH/ov" && cd "$SCRATCH/ov" || exit 1
ov_bad=0
for o in "run.out_dir=''" "model.n_layre=3" "model.n_layer=3.5" "optim.lr='abc'" \
  "train.precision=fp8" "data.train='abc" "run.max_steps=99999999999999999999" "model.n_head=3" \
  "model.n_layer" ".n_layer=2" "data.weights=0.5,x" "data.train=''" \
  "train.micro_batch=1000000000000" "data.train='no_such_shard.bin'" "data.train='.'"; do
  out=$(timeout -k 5 10 "$T" "$D" run.eval_every=0 "$o" 2>&1)
  rc=$?
  if [ $rc -ne 2 ] || ! grep -Eq "^(error: )?<command line>:arg2:[0-9]+: " <<<"$out"; then
    ov_bad=$((ov_bad + 1))
    echo "    override '$o': exit $rc, wanted 2 and <command line>:arg2:"
    sed 's/^/        /' <<<"$out" | tail -3
  fi
done
check "bad overrides: each exits 2 with <command line>:arg2:col ($ov_bad did not)" test "$ov_bad" -eq 0

# ---- layouts that do not divide, under mpirun ----
if command -v "${MPIRUN:-mpirun}" >/dev/null; then
  for args in "2 parallel.tp=3" "2 parallel.pp=2 parallel.schedule=zb_v" \
    "4 parallel.pp=3" "4 parallel.tp=4 model.n_head=2" "4 parallel.pp=4 model.n_layer=2"; do
    set -- $args
    np=$1
    shift
    out=$(timeout -k 5 60 "${MPIRUN:-mpirun}" -np "$np" "$T" "$D" "$@" 2>&1)
    rc=$?
    check "mpirun -np $np $*: exit 2 at <command line>:argN:col (exit $rc)" \
      sh -c "test $rc -eq 2 && printf '%s\n' \"\$1\" | grep -q '^<command line>:arg[0-9]*:[0-9]*: '" _ "$out"
  done
fi
finish
