# lib.sh — shared helpers for the shell tests (sourced).  The harness exports
# top_srcdir and top_builddir; standalone runs default to the current directory.
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}
TESSERA="$top_builddir/src/tessera"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# ranks beyond the cores yield while they wait instead of spinning (Open MPI only yields by
# itself when it knows it oversubscribes, which depends on how it reads the machine): an
# oversubscribed test then takes about the same time wherever it runs
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
TESTS_PASSED=0
TESTS_FAILED=0

ok() { TESTS_PASSED=$((TESTS_PASSED + 1)); echo "PASS: $*"; }
bad() { TESTS_FAILED=$((TESTS_FAILED + 1)); echo "FAIL: $*"; }
check() { # check "description" command...
  local what=$1; shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
finish() {
  echo "$(basename "$0"): $TESTS_PASSED checks passed, $TESTS_FAILED failed"
  [ "$TESTS_FAILED" -eq 0 ] && exit 0 || exit 1
}
skip() { echo "SKIP: $*"; exit 77; }

# A scratch directory removed on exit.
scratch() {
  SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/tsr-test.XXXXXX")
  trap 'rm -rf "$SCRATCH"' EXIT
}

# For the tests that launch the trainer under MPI: skip (77) without the trainer, mpirun
# or Debian's fortunes; one thread per rank (they oversubscribe 2 cores); a scratch dir.
mpi_test_setup() {
  [ -x "$TESSERA" ] || skip "no $TESSERA"
  MPIRUN=${MPIRUN:-mpirun}
  command -v "$MPIRUN" >/dev/null || skip "no mpirun"
  [ -d /usr/share/games/fortunes ] || skip "fortunes not installed"
  export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
  scratch
}

# launch [-n NP] [-t SECONDS] [-o NAME] [-l LOG] [-a] [-r RCFILE] [OVERRIDE...]: the trainer
# on the deck /dev/null with the test's settings "${C[@]}" (where it defines C), then
# run.out_dir (-o), then the overrides, under a timeout (SECONDS, 120 by default: a hang is
# a failure, exit 124).  Returns the job's exit code.
#  -n NP      under $MPIRUN with NP ranks; without it, one process and no mpirun
#  -o NAME    run.out_dir=$SCRATCH/NAME, and the output into $SCRATCH/NAME.out
#  -l LOG     the output into $SCRATCH/LOG.out instead (without -o or -l: stdout and stderr)
#  -a         append to that file (a run resumed in the same directory) instead of replacing it
#  -r RCFILE  each rank appends "rank R exit C" to RCFILE, and the job's exit code is 0 (or
#             timeout's 124): mpirun then does not kill a rank still on its way out when
#             another one has exited nonzero (that race lost lines on a busy machine)
launch() {
  local np='' secs=120 dir='' log='' append='' rcfile='' opt OPTIND=1
  while getopts n:t:o:l:ar: opt; do
    case $opt in
    n) np=$OPTARG ;;
    t) secs=$OPTARG ;;
    o) dir=$OPTARG ;;
    l) log=$OPTARG ;;
    a) append=1 ;;
    r) rcfile=$OPTARG ;;
    *) echo "launch: unknown option" >&2; return 2 ;;
    esac
  done
  shift $((OPTIND - 1))
  local cmd=("$TESSERA" /dev/null ${C+"${C[@]}"})
  [ -n "$dir" ] && cmd+=("run.out_dir=$SCRATCH/$dir")
  cmd+=("$@")
  # shellcheck disable=SC2016 # expanded by the wrapper shell of each rank
  [ -n "$rcfile" ] &&
    cmd=(sh -c 'f=$1; shift; "$@"; c=$?; echo "rank $OMPI_COMM_WORLD_RANK exit $c" >>"$f"' sh "$rcfile" "${cmd[@]}")
  [ -n "$np" ] && cmd=("$MPIRUN" -np "$np" "${cmd[@]}")
  log=${log:-$dir}
  if [ -z "$log" ]; then
    timeout "$secs" "${cmd[@]}"
  elif [ -n "$append" ]; then
    timeout "$secs" "${cmd[@]}" >>"$SCRATCH/$log.out" 2>&1
  else
    timeout "$secs" "${cmd[@]}" >"$SCRATCH/$log.out" 2>&1
  fi
}

# bytes_corpus NAME...: byte-level shards in $SCRATCH/data of the named fortune files
# (one file as it is, several concatenated first).
bytes_corpus() {
  local src="/usr/share/games/fortunes/$1"
  if [ $# -gt 1 ]; then
    local f
    for f in "$@"; do cat "/usr/share/games/fortunes/$f"; done >"$SCRATCH/text.txt"
    src="$SCRATCH/text.txt"
  fi
  "$top_srcdir/tools/tsr-prepare" --out "$SCRATCH/data" --tokenizer bytes "$src" >/dev/null ||
    { bad "tsr-prepare"; finish; }
}

# emu_build: the programs on the CPU emulation of the CUDA runtime, built once per build
# tree and state of the sources, and shared by the tests under a lock (compiling the
# emulated kernels takes a minute of CPU): EMU_BUILD is set to their folder,
# $top_builddir/tests/emu-build-KEY, where emu/emu-test-kernels.sh left test_kernels,
# test_device and the kernel objects, and emu/emu-tessera.sh the trainer, tessera; and
# EMU_KERNELS_FROM is exported as that folder (emu/kernels.sh copies those objects instead
# of compiling them again).  KEY hashes every file the builds read (emu/, cuda/, the C
# sources and headers of src/ and tests/cuda/, the build tree's Makefile) and the
# compilers' versions: an edit builds anew, in a new folder, the old ones removed.
# Skips without g++ or python3; stops the test with the build log when a build fails.
emu_build() {
  command -v g++ >/dev/null || skip "no g++"
  command -v python3 >/dev/null || skip "no python3"
  local key dir
  dir=$(cd "$top_builddir/tests" && pwd)
  key=$( (cd "$top_srcdir" && find emu cuda src tests/cuda tests/testutil.h -type f \( -path 'emu/*' \
     -o -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) | LC_ALL=C sort |
     xargs sha256sum
   sha256sum <"$top_builddir/Makefile"
   gcc -dumpfullversion; g++ -dumpfullversion) | sha256sum | cut -c1-16)
  EMU_BUILD="$dir/emu-build-$key"
  (flock 9
   [ -f "$EMU_BUILD/built" ] && exit 0
   rm -rf "$dir"/emu-build-*/
   { bash "$top_srcdir/emu/emu-test-kernels.sh" "$EMU_BUILD.tmp" &&
       EMU_KERNELS_FROM="$EMU_BUILD.tmp" bash "$top_srcdir/emu/emu-tessera.sh" "$EMU_BUILD.tmp/tessera" &&
       mv "$EMU_BUILD.tmp" "$EMU_BUILD" && touch "$EMU_BUILD/built"; } >"$dir/emu-build.log" 2>&1
  ) 9>"$dir/emu-build.lock" ||
    { cat "$dir/emu-build.log"; bad "building the programs on the emulated GPU"; finish; }
  export EMU_KERNELS_FROM=$EMU_BUILD
}

# emu_link WHAT OUT [PROGRAM.c CPPFLAG...]: tessera (or PROGRAM.c) linked with the CUDA
# backend on the CPU emulation (emu/emu-tessera.sh) into OUT: tessera is emu_build's,
# PROGRAM.c is linked with its kernel objects; skips without g++ or python3, stops the
# test with the build log if the link fails, passes "WHAT linked ...".
emu_link() {
  local what=$1
  shift
  emu_build
  if [ $# -eq 1 ]; then
    cp "$EMU_BUILD/tessera" "$1"
  else
    bash "$top_srcdir/emu/emu-tessera.sh" "$@" >"$SCRATCH/build.log" 2>&1
  fi || { cat "$SCRATCH/build.log" 2>/dev/null; bad "linking $what on the emulated GPU"; finish; }
  ok "$what linked with the CUDA backend and NCCL on the emulated GPU"
}

# emu_trainer_setup: the start of a test of the trainer on the emulated GPU: MPI's
# settings (mpi_test_setup), the emulated tessera as $EMU, the computers byte corpus, and
# the MFU probe's GEMM kept small (it is a plain loop on the emulation).
emu_trainer_setup() {
  mpi_test_setup
  EMU="$SCRATCH/tessera-emu"
  emu_link tessera "$EMU"
  bytes_corpus computers
  export TSR_GEMM_PROBE_N=64
}
# emu_run NAME DEVICE NP ARGS...: the trainer on the deck settings of the caller's array C
# and ARGS, on DEVICE (cuda: $EMU, the ranks sharing the emulated GPU), into $SCRATCH/NAME
# (its output NAME.out); returns its exit code.
emu_run() {
  local name=$1 dev=$2 np=$3 bin="$TESSERA"
  shift 3
  [ "$dev" = cuda ] && bin="$EMU"
  timeout 600 "$MPIRUN" -np "$np" "$bin" /dev/null "${C[@]}" run.device="$dev" \
    run.gpu_share=.true. run.out_dir="$SCRATCH/$name" "$@" >"$SCRATCH/$name.out" 2>&1
}
# same_metrics A B: every step's loss, gradient norm, loss scale and skip of runs A and B
# (under $SCRATCH) exactly equal (a skipped step's non-finite norm included), 2 steps or more
same_metrics() {
  "$PYTHON_REF" - "$SCRATCH/$1/metrics.jsonl" "$SCRATCH/$2/metrics.jsonl" <<'PY'
import json, sys
keys = ("step", "loss", "grad_norm", "loss_scale", "step_skipped")
rows = [[tuple(repr(d.get(k)) for k in keys) for d in map(json.loads, open(p)) if "loss" in d]
        for p in sys.argv[1:]]
print(f"    {len(rows[0])} steps: {rows[0][-1] if rows[0] else ()}")
sys.exit(0 if rows[0] == rows[1] and len(rows[0]) >= 2 else 1)
PY
}
# same_ckpt_file A B: checkpoint files A and B hold equal /model and /optim datasets
same_ckpt_file() {
  h5diff "$1" "$2" /model /model >/dev/null && h5diff "$1" "$2" /optim /optim >/dev/null
}
# same_ckpt A B: the final checkpoints of runs A and B (under $SCRATCH) the same so
same_ckpt() {
  same_ckpt_file "$(ls "$SCRATCH/$1"/ckpt/step_*.h5 | tail -1)" \
    "$(ls "$SCRATCH/$2"/ckpt/step_*.h5 | tail -1)"
}
# skips NAME: the steps run NAME (under $SCRATCH) skipped (its metrics.jsonl)
skips() {
  "$PYTHON_REF" -c "import json,sys; print(sum(json.loads(l).get('step_skipped', 0) for l in open(sys.argv[1])))" \
    "$SCRATCH/$1/metrics.jsonl"
}

# The fortunes corpus (SentencePiece BPE, 2048 pieces), built once per build tree and
# shared by the tests under a lock.  Sets CORPUS to its directory.
corpus() {
  command -v spm_train >/dev/null || skip "spm_train not installed (apt-get install sentencepiece)"
  [ -d /usr/share/games/fortunes ] || skip "fortunes not installed (apt-get install fortunes)"
  CORPUS="$top_builddir/tests/corpus-fortunes"
  mkdir -p "$CORPUS"
  (flock 9; "$top_srcdir/tools/fortunes-corpus.sh" "$CORPUS" 2048 >"$CORPUS.log" 2>&1) 9>"$CORPUS.lock" ||
    { cat "$CORPUS.log"; bad "building the fortunes corpus"; finish; }
}

# hf_python: HF_PYTHON, a Python that imports transformers and safetensors on Debian's
# torch, for the tests that compare with Hugging Face's models: $TSR_HF_PYTHON when set,
# else a virtual environment made once per build tree under a lock (tests/hf-venv:
# $PYTHON_REF -m venv --system-site-packages, then pip install transformers==4.44.2 and
# safetensors).  Skips (77), saying why, when neither can import them (no network for pip).
hf_python() {
  local venv="$top_builddir/tests/hf-venv"
  HF_PYTHON=${TSR_HF_PYTHON:-$venv/bin/python}
  if [ -z "${TSR_HF_PYTHON:-}" ]; then
    (flock 9
     "$HF_PYTHON" -c 'import transformers, safetensors' 2>/dev/null && exit 0
     "$PYTHON_REF" -m venv --system-site-packages "$venv" &&
       "$venv/bin/pip" install -q 'transformers==4.44.2' safetensors) 9>"$venv.lock" >"$venv.log" 2>&1
  fi
  "$HF_PYTHON" -c 'import transformers, safetensors, torch' >/dev/null 2>&1 ||
    skip "transformers cannot be imported by $HF_PYTHON (its installation: $venv.log, last line: $(tail -n 1 "$venv.log" 2>/dev/null)); set TSR_HF_PYTHON to a Python that has it"
}

# agree_runs DIR_A DIR_B TOL [MIN_STEPS]: the runs in DIR_A and DIR_B logged the same
# steps (at least MIN_STEPS, default 1), and every step's loss (and every validation loss)
# agrees to TOL relative, its gradient norm to 10 x TOL.  Prints the worst differences.
agree_runs() {
  "$PYTHON_REF" - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" "${4:-1}" <<'PY'
import json, sys
def load(p):
    rows = [json.loads(l) for l in open(p)]
    return ({r["step"]: r for r in rows if "loss" in r},
            {r["step"]: r["val_loss"] for r in rows if "val_loss" in r})
(a, va), (b, vb) = load(sys.argv[1]), load(sys.argv[2])
tol = float(sys.argv[3])
assert sorted(a) == sorted(b) and len(a) >= int(sys.argv[4]), (sorted(a), sorted(b))
assert sorted(va) == sorted(vb), (va, vb)
rel = lambda x, y: abs(x - y) / abs(y)
dl = max(rel(a[s]["loss"], b[s]["loss"]) for s in a)
dg = max(rel(a[s]["grad_norm"], b[s]["grad_norm"]) for s in a)
dv = max((rel(va[s], vb[s]) for s in va), default=0.0)
print(f"    {len(a)} steps: loss {b[min(b)]['loss']:.5f} -> {b[max(b)]['loss']:.5f}; worst relative "
      f"difference: loss {dl:.1e}, grad norm {dg:.1e}, val loss {dv:.1e} ({len(va)} evals)")
sys.exit(0 if dl <= tol and dg <= 10 * tol and dv <= tol else 1)
PY
}

# The value of KEY on the metrics line of STEP (exact text, 17 significant digits).
metric() { # metric FILE STEP KEY
  "$PYTHON_REF" - "$@" <<'PY'
import json, sys
path, step, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
val = None
for line in open(path):
    d = json.loads(line)
    if d.get("step") == step and key in d:
        val = d[key]
print(repr(val))
PY
}

# same_losses A B TOL: runs $SCRATCH/A and $SCRATCH/B have the same loss at every common
# step (and val_loss where both have one), relative to TOL; at least 5 steps in common.
same_losses() {
  "$PYTHON_REF" - "$SCRATCH/$1/metrics.jsonl" "$SCRATCH/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
def load(path, key):
    return {d["step"]: d[key] for d in map(json.loads, open(path)) if key in d}
a, b = load(sys.argv[1], "loss"), load(sys.argv[2], "loss")
va, vb = load(sys.argv[1], "val_loss"), load(sys.argv[2], "val_loss")
steps = sorted(set(a) & set(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in steps) if steps else 1.0
vworst = max((abs(va[s] - vb[s]) / abs(va[s]) for s in set(va) & set(vb)), default=0.0)
print(f"    {len(steps)} common steps, worst relative loss difference {worst:.2e}, val {vworst:.2e}")
tol = float(sys.argv[3])
sys.exit(0 if len(steps) >= 5 and len(b) >= 5 and worst <= tol and vworst <= tol else 1)
PY
}

# README.md's shell blocks, run as written (tests/e2e/readme_blocks.py; the lint is
# tests/lint/readme_blocks.sh).
# readme_block NAME FILE [REGEX ARGS]...: the block after the comment "<!-- readme-example:
# NAME" into FILE, with ARGS appended to each command that REGEX matches; a missing block,
# or a REGEX that matches no command, fails the test.
readme_block() {
  local name=$1 file=$2
  shift 2
  "$PYTHON_REF" "$top_srcdir/tests/e2e/readme_blocks.py" block "$top_srcdir/README.md" \
    "$name" "$@" >"$file" || { bad "README.md's block '$name' as the test runs it"; return 1; }
  sed 's/^/    | /' "$file"
}
# readme_tree DIR: DIR set up as the top of a source tree for the README's commands: links
# to the tree's tools/, input/ and jobs/, src/tessera (the built one), the shared fortunes
# corpus as data/fortunes (tests/lib.sh corpus), and DIR/bin/tessera, first on PATH, for
# the commands that name an installed `tessera`.
readme_tree() {
  local d=$1 top bin
  top=$(cd "$top_srcdir" && pwd)
  bin=$(cd "$(dirname "$TESSERA")" && pwd)/tessera
  mkdir -p "$d/src" "$d/data" "$d/bin"
  ln -s "$top/tools" "$d/tools"
  ln -s "$top/input" "$d/input"
  ln -s "$top/jobs" "$d/jobs"
  ln -s "$bin" "$d/src/tessera"
  ln -s "$bin" "$d/bin/tessera"
  [ -n "${CORPUS:-}" ] && ln -s "$(cd "$CORPUS" && pwd)" "$d/data/fortunes"
  export PATH="$(cd "$d/bin" && pwd):$PATH"
}
# readme_run NAME DIR FILE [SECONDS]: runs FILE in DIR with bash -eu -o pipefail (so the
# block fails at its first failing command) under a timeout (600 s), its output into
# FILE.out; passes or fails "README.md's block NAME runs as written".
readme_run() {
  local name=$1 dir=$2 file=$3 secs=${4:-600} rc
  (cd "$dir" && timeout "$secs" bash -eu -o pipefail "$file") >"$file.out" 2>&1
  rc=$?
  [ $rc -eq 0 ] || tail -n 25 "$file.out" | sed 's/^/    /'
  check "README.md's block '$name' runs as written (exit $rc)" test $rc -eq 0
  return $rc
}
