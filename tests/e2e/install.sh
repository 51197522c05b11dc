#!/usr/bin/env bash
# install.sh — `make install` gives a prefix that works on its own, outside the source tree.
# The build is installed into a temporary prefix by README.md's block 'install', run as
# written with HOME in the scratch directory (`make install prefix=$HOME/tessera`, so the
# binary was configured for another prefix and must find its data beside itself; the block
# then makes the fortunes corpus in ./run, trains `tessera tiny` for 2 steps, appended, and
# plans llama1b); then, in a directory of its own with only the prefix's bin/ added to PATH:
#   - the installed fortunes-corpus.sh (and the tsr-prepare beside it) make a small corpus
#     under data/fortunes, where the tiny deck looks for it;
#   - `mpirun -np 2 tessera tiny` trains the installed deck, found by name, for 4 steps to
#     a checkpoint: out/ and the checkpoint are under the current directory, nothing is
#     written into the prefix; `tessera eval tiny.nml` evaluates that checkpoint;
#   - `tessera plan llama1b` plans the installed deck (its d_model 2048 in the output); a
#     file of that name in the current directory comes first, then $TESSERA_DATADIR/input,
#     then the install; an unknown name exits 2 and lists where it looked and the decks there;
#   - the installed smoke.slurm finds the installed trainer: its dry run names it, and run
#     with a stand-in srun (mpirun on 2 ranks) it trains 2 steps and exits 0;
#   - tsr-export and tsr-plot read the run (when their python has h5py and matplotlib);
#   - `make uninstall` leaves no file behind.
# `make installcheck` runs it on the configured prefix instead (TSR_INSTALL_BINDIR and
# TSR_INSTALL_PKGDATADIR set): no install, no uninstall.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
command -v spm_train >/dev/null || skip "spm_train not installed (apt-get install sentencepiece)"
MPIRUN=$(command -v "$MPIRUN")
BLD=$(cd "$top_builddir" && pwd)
if [ -n "${TSR_INSTALL_BINDIR:-}" ]; then
  B=$TSR_INSTALL_BINDIR D=$TSR_INSTALL_PKGDATADIR own=0
else
  # README.md's block 'install' as written, from a HOME in the scratch directory that
  # holds a Makefile passing `install` on to the build tree; its `tessera tiny` stops after
  # 2 steps.  A make of its own, without the jobserver and variables of the make that runs
  # the tests.
  P=$SCRATCH/home/tessera B=$SCRATCH/home/tessera/bin D=$SCRATCH/home/tessera/share/tessera own=1
  mkdir -p "$SCRATCH/home"
  printf 'install:\n\t$(MAKE) -C %s install\n' "$BLD" >"$SCRATCH/home/Makefile"
  readme_block install "$SCRATCH/install.sh" '^tessera tiny' 'run.max_steps=2 run.eval_steps=1' ||
    finish
  unset MAKEFLAGS MFLAGS MAKELEVEL
  HOME=$SCRATCH/home readme_run install "$SCRATCH/home" "$SCRATCH/install.sh" 900 ||
    { [ -x "$B/tessera" ] || finish; }
  check "  ... it installed into \$HOME/tessera, trained out/tiny in ./run and planned llama1b" \
    sh -c "test -x '$B/tessera' && test -f '$SCRATCH/home/run/out/tiny/ckpt/step_00000002.h5' &&
      grep -q 'd_model 2048' '$SCRATCH/install.sh.out'"
fi

missing=
for f in "$B"/{tessera,tsr-prepare,tsr-export,tsr-import,tsr-plot,fortunes-corpus.sh}; do
  [ -x "$f" ] || missing="$missing $f"
done
for f in "$D"/input/{tiny,gpt2_124m,llama1b,llm7b,llm70b}.nml "$D"/jobs/{lib.sh,smoke.slurm,llm7b.slurm,llm70b.slurm}; do
  [ -f "$f" ] || missing="$missing $f"
done
check "installed: tessera and the tools in bin/, the decks and job scripts in share/tessera${missing:+ (missing:$missing)}" \
  test -z "$missing"

ok_and() { # ok_and RC COMMAND...: RC is 0 and COMMAND succeeds
  [ "$1" -eq 0 ] || return 1
  shift
  "$@"
}

W=$SCRATCH/work
mkdir -p "$W/fortunes" "$W/alt/input" && cd "$W" || exit 1
export PATH="$B:$PATH"
unset TESSERA_DATADIR
check "tessera on PATH is the installed one" test "$(command -v tessera)" = "$B/tessera"
touch "$SCRATCH/before"

# A small corpus with the installed scripts: one fortune file, a 512-piece BPE.
cp /usr/share/games/fortunes/computers "$W/fortunes/"
FORTUNES_DIR=$W/fortunes timeout 300 fortunes-corpus.sh data/fortunes 512 >corpus.log 2>&1
rc=$?
check "fortunes-corpus.sh (installed) makes data/fortunes (exit $rc)" \
  test $rc -eq 0 -a -s data/fortunes/train_000.bin -a -s data/fortunes/valid_000.bin \
  -a -s data/fortunes/fortunes.model
[ $rc -eq 0 ] || cat corpus.log
timeout 120 tsr-prepare --out data/bytes --tokenizer bytes fortunes/computers >prepare.log 2>&1
check "tsr-prepare (installed) writes byte-level shards (exit $?)" test -s data/bytes/train_000.bin

# Training the installed deck by name; its relative paths are under the current directory.
timeout 300 "$MPIRUN" -np 2 tessera tiny parallel.tp=2 run.max_steps=4 run.log_every=1 \
  run.eval_every=4 run.eval_steps=1 checkpoint.every_steps=4 >train.out 2>&1
rc=$?
check "mpirun -np 2 tessera tiny: 4 steps (exit $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -n 20 train.out
check "  ... the step-4 checkpoint is in ./out/tiny/ckpt" test -f out/tiny/ckpt/step_00000004.h5
check "  ... metrics.jsonl in ./out/tiny has step 4" grep -q '"step":4,"loss"' out/tiny/metrics.jsonl
written=$(find "$B" "$D" -newer "$SCRATCH/before" -type f 2>/dev/null | head -n 3)
check "  ... nothing was written into the prefix${written:+ ($written)}" test -z "$written"
timeout 120 tessera eval tiny.nml >eval.out 2>&1
rc=$?
check "tessera eval tiny.nml: the step-4 checkpoint (exit $rc)" \
  ok_and $rc grep -q 'eval .*step_00000004.h5: step 4 | val loss' eval.out
[ $rc -eq 0 ] || tail -n 20 eval.out

# Planning by name, and the order of the places a name is looked up in.
plan_shows() { # plan_shows TEXT ARGS...: `tessera plan ARGS` exits 0 and prints TEXT
  local text=$1 out
  shift
  out=$(timeout 60 tessera plan "$@" 2>&1) || { echo "    tessera plan $*: $out" | head -n 5; return 1; }
  grep -q -- "$text" <<<"$out" || { echo "    tessera plan $* does not say '$text'"; return 1; }
}
check "tessera plan llama1b: the installed deck" plan_shows 'd_model 2048' llama1b
check "tessera plan --nodes 2 llama1b.nml --json" plan_shows '"nodes"' --nodes 2 llama1b.nml --json
cp "$D/input/tiny.nml" alt/input/llama1b.nml
TESSERA_DATADIR=$W/alt check "TESSERA_DATADIR/input comes before the install" \
  plan_shows 'd_model 128' llama1b --gpus-per-node 1
cp "$D/input/tiny.nml" llama1b
check "a file of that name in the current directory comes first" \
  plan_shows 'd_model 128' llama1b --gpus-per-node 1
rm -f llama1b
beside=$(cd "$D/input" && pwd -P) # (the trainer, in libexec/tessera, finds share/ beside)
for cmd in "plan" "eval" ""; do
  # shellcheck disable=SC2086 # $cmd: the subcommand, or nothing
  timeout 60 tessera $cmd nosuch >nosuch.out 2>&1
  rc=$?
  check "tessera ${cmd:+$cmd }nosuch: exit 2 (got $rc), where it looked, the decks there" \
    test $rc -eq 2 -a "$(grep -c -e "^error: no deck 'nosuch'" -e "^  $beside " \
    -e '^decks there: gpt2_124m llama1b llama3_8b_128k llm70b llm7b tiny$' nosuch.out)" = 3
done

# The installed job script, from here: the dry run names the installed trainer; with a
# stand-in srun that starts the step with mpirun it trains.
TSR_JOB_DRY_RUN=1 timeout 60 bash "$D/jobs/smoke.slurm" >dry.out 2>&1
rc=$?
check "smoke.slurm dry run: exit 0 (got $rc), runs $B/tessera on the deck tiny" \
  ok_and $rc grep -q "not started: srun .* $B/tessera tiny " dry.out
TSR_JOB_DRY_RUN=1 timeout 60 bash "$D/jobs/llm70b.slurm" >dry70.out 2>&1
check "llm70b.slurm dry run: the installed trainer, the deck llm70b" \
  grep -q "not started: srun .* $B/tessera llm70b " dry70.out
mkdir -p srun-bin
cat >srun-bin/srun <<EOF
#!/bin/bash
while [ "\${1#--}" != "\$1" ]; do shift; done # srun's own options
exec "$MPIRUN" -np 2 "\$@"
EOF
chmod +x srun-bin/srun
PATH="$W/srun-bin:$PATH" SLURM_JOB_ID=7 MAX_STEPS=2 timeout 300 bash "$D/jobs/smoke.slurm" \
  >job.out 2>&1
rc=$?
check "smoke.slurm with a stand-in srun: 2 steps, exit 0 (got $rc)" \
  ok_and $rc grep -q '"step":2,"loss"' out/smoke/metrics.jsonl
[ $rc -eq 0 ] || tail -n 20 job.out
check "  ... and says which trainer ran" grep -q "trainer: $B/tessera (installed)" job.out

# The Python tools, with the interpreter of their #! line.
py=$(sed -n '1s/^#! *//p' "$B/tsr-export")
if $py -c 'import h5py, numpy, matplotlib' 2>/dev/null; then
  timeout 120 tsr-export out/tiny/ckpt/step_00000004.h5 tiny.safetensors >export.out 2>&1
  check "tsr-export (installed) writes the checkpoint's tensors (exit $?)" test -s tiny.safetensors
  timeout 120 tsr-plot out/tiny -o tiny.png >plot.out 2>&1
  check "tsr-plot (installed) draws the run (exit $?)" test -s tiny.png
else
  echo "    tsr-export and tsr-plot not run: no h5py, numpy or matplotlib for $py"
  check "tsr-plot --help (installed)" tsr-plot --help >/dev/null
fi

if [ $own = 1 ]; then
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$BLD" uninstall prefix="$P" \
    >"$SCRATCH/uninstall.log" 2>&1
  left=$(find "$P" -type f | head -n 3)
  check "make uninstall leaves no file behind${left:+ ($left)}" test -z "$left"
fi
finish
