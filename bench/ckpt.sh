#!/usr/bin/env bash
# ckpt.sh — checkpoint write / read bandwidth against dd in the same directory, one run.
# The trainer saves a d_model 512, 8-layer llama (fp32 master + Adam m, v: ~330 MB) on NP
# ranks (dp, zero 1: each rank writes its shard); write MB/s is from its "checkpoint:
# wrote ... MB/s" line (which also gives the phases: checksums, dataset writes, close,
# verify + fsync + publish), read from "checkpoint: loaded ... in S s" of a resume.
# Reference: dd of the same byte count with conv=fsync, and a dd read of it (page cache
# dropped when allowed).  Prints the ratios (target >= 0.7); never fails on time.
#
# Method, because single runs on a VM swing by 3x or more: the pair is repeated REPS
# times (default 5) and the medians compared; every write goes to a new file in a new
# directory (nothing is deleted until the end: freeing a just-written file made the next
# write up to 10x slower here, whichever program did it).  A second write reference is
# dd copying the checkpoint file itself (from the page cache, conv=fsync): the same bytes
# coming from memory rather than dd's one cache-resident block of zeros.
# Memory first touched: on this Firecracker VM (DAMON reclaim and free-page reporting to
# the host) a page the kernel has not used lately costs about 2 ms per MB on first touch,
# so a write into the page cache ran at 0.35 GB/s or 5 GB/s depending on which free pages
# it got, for dd as for the trainer.  Before every timed write (dd's and the trainer's) the
# bench touches and frees 16 times the checkpoint's size (the trainer's own arrays, ~1 GB
# here, take the first of those pages; with 8 times, 1-2 of 7 trainer writes still hit cold
# pages), so that both measure the I/O path.
# Usage: bench/ckpt.sh [DIR] [NP] [REPS]   (top_builddir / top_srcdir as for the tests)
#
# bench/ckpt.sh async [DIR] [NP] [STEPS] [EVERY]: asynchronous checkpoints (checkpoint.async)
# against synchronous ones on the gpt2_124m deck on the CPU (124 M parameters, a 1.49 GB
# checkpoint; sequences of 64 tokens, one per rank, fp32, dp NP = 2 with ZeRO 1), STEPS
# (default 30) steps with a checkpoint every EVERY (default 10): the same job twice, with
# checkpoint.async = .false. and .true.  For every checkpoint, from metrics.jsonl: the
# synchronous write time (all of it blocks training) and the asynchronous blocked time
# (the snapshot copy and any wait for the write before) and background write time; their
# ratio, target <= 0.10.  Also the mean step time and the whole run's time in each, since
# the background write shares the cores with training, and whether the two runs' losses
# and final checkpoints are bitwise equal.  Before each run it touches and frees 3 GB (see
# "Memory first touched" above; the trainer's own snapshot is touched when it is allocated).
# The kill -9 trials of asynchronous writes are bench/ckpt_kill.sh.
set -u
top_srcdir=${top_srcdir:-.}; top_builddir=${top_builddir:-.}
if [ "${1:-}" = async ]; then
  DIR=${2:-${TMPDIR:-/tmp}/tsr-bench-ckpt-async}; NP=${3:-2}; STEPS=${4:-30}; EVERY=${5:-10}
  PY=/usr/bin/python3
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
  rm -rf "$DIR" && mkdir -p "$DIR" || exit 1
  trap 'rm -rf "$DIR"' EXIT
  "$top_srcdir/tools/tsr-prepare" --out "$DIR/data" --tokenizer bytes /usr/share/games/fortunes/computers >/dev/null
  G=(model.seq_len=64 train.micro_batch=1 train.global_batch="$NP" train.precision=fp32
    run.max_steps="$STEPS" run.log_every=1 run.eval_every=0 "data.train=$DIR/data/train_*.bin"
    "data.valid=''" checkpoint.every_steps="$EVERY" checkpoint.keep=2 checkpoint.resume=none)
  for mode in sync async; do
    $PY -c "import numpy; numpy.ones(3 << 27)" # 3 GB touched and freed
    mpirun -np "$NP" "$top_builddir/src/tessera" "$top_srcdir/input/gpt2_124m.nml" "${G[@]}" \
      checkpoint.async=$([ $mode = async ] && echo T || echo F) run.out_dir="$DIR/$mode" \
      >"$DIR/$mode.out" 2>&1 || { echo "ckpt.sh async: the $mode run failed"; tail "$DIR/$mode.out"; exit 1; }
  done
  grep -h "checkpoint: \(a\)\?synchronous writes" "$DIR/sync.out" "$DIR/async.out"
  $PY - "$DIR" "$STEPS" <<'PY'
import json, re, statistics, sys
import h5py, numpy as np
d, steps = sys.argv[1], int(sys.argv[2])
def load(mode):
    recs = [json.loads(l) for l in open(f"{d}/{mode}/metrics.jsonl")]
    ck = {r["step"]: r for r in recs if r.get("event") == "checkpoint"}
    st = {r["step"]: r for r in recs if "loss" in r}
    done = re.search(r"done: \d+ steps in ([0-9.]+) s", open(f"{d}/{mode}.out").read())
    return ck, st, float(done.group(1))
(cs, ss, ts), (ca, sa, ta) = load("sync"), load("async")
waits = {int(m[1]): float(m[2]) for m in re.finditer(
    r"checkpoint: step (\d+): waiting for the previous checkpoint write \(step \d+\) took ([0-9.]+) s",
    open(f"{d}/async.out").read())}
print(f"{'step':>5} {'sync write s':>13} {'async blocked s':>16} {'of which wait':>14} {'async write s':>14} {'blocked/sync':>13}")
ratios = []
for s in sorted(cs):
    r = ca[s]["blocked_s"] / cs[s]["write_s"]
    ratios.append(r)
    print(f"{s:5d} {cs[s]['write_s']:13.3f} {ca[s]['blocked_s']:16.4f} {waits.get(s, 0.0):14.3f} "
          f"{ca[s]['write_s']:14.3f} {r:13.4f}")
mean_ms = lambda st: statistics.mean(st[s]["step_ms"] for s in st if s > 1)
print(f"blocked / sync write: median {statistics.median(ratios):.4f}, max {max(ratios):.4f} (target <= 0.10)")
print(f"mean step (steps 2..{steps}): sync {mean_ms(ss):.0f} ms, async {mean_ms(sa):.0f} ms "
      f"(the background write shares the cores); whole run: sync {ts:.1f} s, async {ta:.1f} s "
      f"({ta / ts:.3f})")
same = all(repr(ss[s]["loss"]) == repr(sa[s]["loss"]) for s in ss) and sorted(ss) == sorted(sa)
fa, fb = (h5py.File(f"{d}/{m}/ckpt/step_{steps:08d}.h5", "r") for m in ("sync", "async"))
names = []
fa.visit(lambda n: names.append(n) if isinstance(fa[n], h5py.Dataset) else None)
eq = all(np.array_equal(fa[n][...].view(np.uint32), fb[n][...].view(np.uint32)) for n in names)
print(f"losses of all {len(ss)} steps equal: {same}; final checkpoints ({len(names)} datasets) bitwise equal: {eq}")
sys.exit(0 if same and eq else 1)
PY
  exit $?
fi
DIR=${1:-${TMPDIR:-/tmp}/tsr-bench-ckpt}; NP=${2:-2}; REPS=${3:-5}
PY=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# ranks that wait in a collective yield their core (as under srun): on an oversubscribed
# machine a busy-polling rank otherwise takes the core from the one that is writing
export OMPI_MCA_mpi_yield_when_idle=1
rm -rf "$DIR" && mkdir -p "$DIR" || exit 1
trap 'rm -rf "$DIR"' EXIT
"$top_srcdir/tools/tsr-prepare" --out "$DIR/data" --tokenizer bytes /usr/share/games/fortunes/computers >/dev/null
C=(model.vocab_size=256 model.n_layer=8 model.d_model=512 model.n_head=8 model.n_kv_head=8
  model.d_ff=1536 model.seq_len=16 train.micro_batch=1 train.global_batch="$NP" run.log_every=1000
  parallel.zero_stage=1 "data.train=$DIR/data/train_*.bin" checkpoint.keep=1)
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }
now() { date +%s.%N; }
warm_memory() { # touch and free 16 x the checkpoint's bytes (N MB; 1 GB before N is known)
  $PY -c "import numpy; numpy.ones(${N:-64} << 21)"
}

tessera_write() { # REP: one step and its checkpoint into run_REP; sets MB, WMBS, PHASES
  warm_memory
  mpirun -np "$NP" "$top_builddir/src/tessera" /dev/null "${C[@]}" run.max_steps=1 \
    checkpoint.resume=none run.out_dir="$DIR/run_$1" >"$DIR/w_$1.out" 2>&1
  local line
  line=$(grep "checkpoint: wrote" "$DIR/w_$1.out" | tail -1)
  MB=$(sed -n 's/.*(\([0-9.]*\) MB) in .*/\1/p' <<<"$line")
  WMBS=$(sed -n 's/.* s, \([0-9.]*\) MB\/s.*/\1/p' <<<"$line")
  PHASES=$(sed -n 's/.*MB\/s (\(.*\))$/\1/p' <<<"$line")
}
dd_write() { # REP: the same byte count with conv=fsync into dd_REP.bin; sets DDW, and
  # DDC: a copy of the checkpoint just written (its bytes, from the page cache) by dd
  local t0 t1 t2 t3
  warm_memory
  t0=$(now)
  dd if=/dev/zero of="$DIR/dd_$1.bin" bs=1M count="$N" conv=fsync 2>/dev/null
  t1=$(now)
  DDW=$($PY -c "print($N * 1.048576 / ($t1 - $t0))")
  cat "$DIR/run_$1/ckpt/step_00000001.h5" >/dev/null
  warm_memory
  t2=$(now)
  dd if="$DIR/run_$1/ckpt/step_00000001.h5" of="$DIR/ddc_$1.bin" bs=1M conv=fsync 2>/dev/null
  t3=$(now)
  DDC=$($PY -c "print($MB / ($t3 - $t2))")
}

tessera_write 0 # warm-up (binary, data and libraries in the page cache); sets the size
N=$($PY -c "print(max(1, round(${MB:-0})))")
[ "$N" -gt 1 ] || { echo "ckpt.sh: no checkpoint line in $DIR/w_0.out"; cat "$DIR/w_0.out"; exit 1; }
rows=()
for rep in $(seq "$REPS"); do
  tessera_write "$rep"
  dd_write "$rep"
  drop_caches
  mpirun -np "$NP" "$top_builddir/src/tessera" /dev/null "${C[@]}" run.max_steps=1 \
    checkpoint.resume=auto run.out_dir="$DIR/run_$rep" >"$DIR/r_$rep.out" 2>&1
  rs=$(sed -n 's/.*checkpoint: loaded .* in \([0-9.]*\) s.*/\1/p' "$DIR/r_$rep.out" | tail -1)
  drop_caches
  t2=$(now); dd if="$DIR/dd_$rep.bin" of=/dev/null bs=1M 2>/dev/null; t3=$(now)
  ddr=$($PY -c "print($N * 1.048576 / ($t3 - $t2))")
  rmbs=$($PY -c "print($MB / $rs if float('${rs:-0}') > 0 else float('nan'))")
  printf 'rep %d: write %7.1f MB/s  dd %7.1f (%4.2f)  dd copy %7.1f (%4.2f) | read %7.1f MB/s  dd %7.1f (%4.2f) | %s\n' \
    "$rep" "$WMBS" "$DDW" "$($PY -c "print($WMBS / $DDW)")" "$DDC" "$($PY -c "print($WMBS / $DDC)")" \
    "$rmbs" "$ddr" "$($PY -c "print($rmbs / $ddr)")" "$PHASES"
  rows+=("$WMBS $DDW $rmbs $ddr $WMBS $DDC")
done
printf '%s\n' "${rows[@]}" | $PY -c '
import statistics, sys
r = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
med = lambda i: statistics.median(x[i] for x in r)
print(f"checkpoint {sys.argv[1]} MB, {sys.argv[2]} ranks, median of {len(r)} repetitions:")
print("%-10s %13s %10s %7s  (ratio: median of the per-repetition ratios)" % ("", "tessera MB/s", "dd MB/s", "ratio"))
for name, i in (("write", 0), ("read", 2), ("write/copy", 4)):
    ratio = statistics.median(x[i] / x[i + 1] for x in r)
    print(f"{name:10s} {med(i):13.1f} {med(i + 1):10.1f} {ratio:7.2f}")
' "$MB" "$NP"
