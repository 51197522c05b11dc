#!/usr/bin/env bash
# bench/cp_traffic.sh — context parallelism's traffic: the bytes the cp group moves per
# step, as the run logs them ("comm per step"), against the formulas of
# docs/context_parallel.md, for the ring and the all-to-all at cp 2 and cp 4, on the
# shapes of input/tiny.nml (4 layers, d_model 128, 4 heads, 2 KV heads; fp32 and bf16) at
# seq_len 1024, one sequence per micro-batch, 2 micro-batches a step, 2 steps.
#
#   bench/cp_traffic.sh [TESSERA]        (default src/tessera)
#
# Per layer and micro-batch a rank of N = B T / cp rows sends:
#   ring (p2p):  its K|V block, N x 2 KV hd elements of the storage type, cp - 1 times in
#                the forward and cp - 1 times in the backward, and the fp32 dK|dV sums
#                cp times in the backward;
#   a2a:         (cp - 1) N W elements for q|k|v (W = (H/cp + 2 KVc) hd, KVc = KV / cp
#                or 1) three times (forward, again in the backward, and the gradient
#                back) and (cp - 1) N (H/cp) hd for out, out again and dout, in the
#                storage type.
# The ratio measured / formula must print 1.00.  Also printed: the step time against the
# same run on one rank (a 2-core machine shares its cores between the ranks, so this says
# what the exchange costs here, not on a GPU).
set -euo pipefail
TESSERA=${1:-src/tessera}
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON_REF:-/usr/bin/python3}
W=$(mktemp -d /tmp/tsr-bench-cp.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
"$here/tools/tsr-prepare" --out "$W/data" --tokenizer bytes \
  /usr/share/games/fortunes/computers /usr/share/games/fortunes/science >/dev/null
T=1024 B=1 K=2 L=4
C=("$here/input/tiny.nml" model.vocab_size=256 model.seq_len=$T train.micro_batch=$B
  train.global_batch=$K run.max_steps=2 run.log_every=1 run.eval_every=0 run.sample_every=0
  "data.train=$W/data/train_*.bin" data.valid= checkpoint.resume=none checkpoint.every_steps=0
  checkpoint.save_last=.false.)
printf '%-6s %-5s %3s | %12s %12s %6s | %10s %10s\n' precision way cp "measured MB" "formula MB" \
  ratio "step ms" "1 rank ms"
for prec in fp32 bf16; do
  mpirun -np 1 "$TESSERA" "${C[@]}" train.precision=$prec run.out_dir="$W/one_$prec" \
    >"$W/one_$prec.out" 2>&1
  one=$("$PY" -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print('%.0f' % [x['step_ms'] for x in r if 'step_ms' in x][-1])" "$W/one_$prec/metrics.jsonl")
  for way in p2p a2a; do
    for cp in 2 4; do
      out=$W/${prec}_${way}_$cp
      mpirun -np $cp "$TESSERA" "${C[@]}" train.precision=$prec parallel.cp=$cp \
        parallel.cp_comm=$way run.out_dir="$out" >"$out.out" 2>&1
      kind=$([ $way = p2p ] && echo send || echo all_to_all)
      got=$(sed -n "s/.*; cp [0-9.]* MB ([^)]*$kind \([0-9.]*\).*/\1/p" "$out.out" | head -1)
      ms=$("$PY" -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print('%.0f' % [x['step_ms'] for x in r if 'step_ms' in x][-1])" "$out/metrics.jsonl")
      "$PY" - "$prec" "$way" "$cp" "$got" "$ms" "$one" "$T" "$B" "$K" "$L" <<'PY'
import sys
prec, way, cp, got, ms, one = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
T, B, K, L = map(int, sys.argv[7:11])
H, KV, hd = 4, 2, 128 // 4           # input/tiny.nml: d_model 128, 4 heads, 2 KV heads
esz = 4 if prec == "fp32" else 2
N = B * T // cp
if way == "p2p":
    kv = N * 2 * KV * hd
    per = (2 * (cp - 1) * kv) * esz + cp * kv * 4
else:
    Hc, KVc = H // cp, (KV // cp if KV >= cp else 1)
    Wd, w = (Hc + 2 * KVc) * hd, Hc * hd
    per = (cp - 1) * N * (3 * Wd + 3 * w) * esz
want = per * L * K / 1e6
print(f"{prec:<6} {way:<5} {cp:>3} | {got:12.3f} {want:12.3f} {got / want:6.2f} | {ms:>10} {one:>10}")
PY
    done
  done
done
