#!/usr/bin/env bash
# plan_offload.sh — `tessera plan` with the optimizer offload (parallel.offload = 'optimizer';
# docs/offload.md), and the trainer's side of it.
#  1. llm70b does not fit on one node of 8 H100s without the offload; --search then tries
#     it and finds layouts that fit, each with its page-locked host memory a node under
#     the node's 2048 GB (--require-fit exits 0); the same on 8 A100s.
#  2. The fastest of them planned alone: the memory table's host column and the node's
#     total, the PCIe row of the traffic table, the offloaded update in the step; in the
#     JSON, against the same layout without offload, the device 12 bytes a parameter of
#     the shard lighter and the host holding 18 (master 4, m and v 8, the gradient's copy
#     4, the compute copy's staging 2), 4 of them copied to the host and 2 back, 30 moved
#     by the CPU's AdamW, at the hardware's figures; at ZeRO 2-3 also the device's fp32
#     gradient shard and landing area (8 B) gone for three landing areas of the largest
#     unit piece, whose 4 B staging the host holds.
#  3. A node whose host memory (hardware.host_memory_gb) cannot hold that: 'fits: NO',
#     a line naming the keys and the bytes, exit 3 with --require-fit.
#  4. Bad input: parallel.offload_fraction = 1.5 and parallel.offload = 'cpu' exit 2
#     naming the key.
#  5. The activation offload in the search: llm70b at 32768 tokens on one node of 4 H100s
#     fits only with train.activation_offload as well as the optimizer offload; every
#     proposed layout carries both; held off on the command line, nothing fits.  The fastest planned
#     alone: the traffic table's 'host (act offload)' row, in the JSON its layer blocks
#     each way a step (micro-batches x the host column's blocks / slots); without the
#     activation offload it does not fit.  On llm7b (1 x 8), with the activation offload
#     held on, zero-bubble layouts are proposed too; planned alone, one brings every block
#     back twice (its W pass).
#  6. The trainer on the emulated GPU (emu/emu-tessera.sh; skipped without g++): one rank
#     and dp 2 with ZeRO-3, bf16, offloaded; its memory line after step 1 puts the device
#     memory in use and the page-locked host memory ZeRO allocated next to the plan's
#     device and host columns, each within 10%.  A node without the host memory for it
#     (TSR_FAULT offload_host_mb=1) stops before any step with exit 2, naming
#     parallel.offload and the bytes.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
[ -x "$TESSERA" ] || skip "no $TESSERA"
scratch
big="$top_srcdir/input/llm70b.nml"

# ---- 1. the search on one node
for hw in h100 a100; do
  "$TESSERA" plan "$big" --nodes 1 --gpus-per-node 8 --hardware $hw --search --top 3 \
    --require-fit >"$SCRATCH/$hw.txt" 2>&1
  rc=$?
  sed -n '/^search on/,/^the deck/p' "$SCRATCH/$hw.txt" | cut -c1-150 | sed 's/^/    /'
  check "llm70b on 1 x 8 $hw: the search tries the offload and a layout fits (--require-fit: exit $rc)" \
    sh -c "test $rc -eq 0 && grep -q '^optimizer offload tried, as nothing fits without it' '$SCRATCH/$hw.txt' &&
      grep -qE '^ +1 +[0-9]+ +[0-9]+ .* [0-9]+  yes$' '$SCRATCH/$hw.txt'"
  "$TESSERA" plan "$big" --nodes 1 --gpus-per-node 8 --hardware $hw --search --json \
    >"$SCRATCH/$hw.json" 2>&1
  check "  ... the JSON: offload searched, every listed layout offloaded and fitting, host < 2048 GB a node" \
    "$PYTHON_REF" -c "
import json, sys
s = json.load(open(sys.argv[1]))['search']
l = s['layouts']
print(f\"    {s['fit']} fit; the fastest: tp {l[0]['tp']} pp {l[0]['pp']} v {l[0]['virtual_stages']} \"
      f\"zero {l[0]['zero_stage']}, {l[0]['memory_gb']:.1f} GB a GPU, {l[0]['host_gb_per_node']:.0f} GB \"
      f\"host a node, step {l[0]['step_s']:.1f} s\")
ok = s['offload_searched'] and s['fit'] > 0 and l
ok = ok and all(x['offload'] == 'optimizer' and x['fits'] and x['fits_host'] and
                0 < x['host_gb_per_node'] < 2048 and x['memory_gb'] + 2 <= 80 for x in l)
sys.exit(0 if ok else 1)" "$SCRATCH/$hw.json"
done
"$TESSERA" plan "$big" --nodes 1 --gpus-per-node 8 --search --json parallel.offload=none \
  >"$SCRATCH/none.json" 2>&1
check "  ... held off (parallel.offload=none), nothing fits on that node" "$PYTHON_REF" -c "
import json, sys
s = json.load(open(sys.argv[1]))['search']
sys.exit(0 if s['fit'] == 0 and not s['offload_searched'] else 1)" "$SCRATCH/none.json"

# ---- 2. the fastest offloaded layout, planned alone
L=$("$PYTHON_REF" -c "
import json, sys
x = json.load(open(sys.argv[1]))['search']['layouts'][0]
print(f\"parallel.tp={x['tp']} parallel.pp={x['pp']} parallel.virtual_stages={x['virtual_stages']} \"
      f\"parallel.schedule={x['schedule']} parallel.zero_stage={x['zero_stage']} \"
      f\"train.micro_batch={x['micro_batch']} train.recompute={x['recompute']} \"
      f\"parallel.sequence_parallel={'T' if x['sequence_parallel'] else 'F'}\")" "$SCRATCH/h100.json")
read -r -a LAY <<<"$L"
echo "    layout: ${LAY[*]}"
"$TESSERA" plan "$big" --nodes 1 --gpus-per-node 8 "${LAY[@]}" parallel.offload=optimizer \
  --require-fit >"$SCRATCH/one.txt" 2>&1
rc=$?
sed -n '/^memory/,/^  fits/p;/^  host (offload)/p;/^  offloaded update/p;/^  if overlapped/p;/^  step /p' \
  "$SCRATCH/one.txt" | cut -c1-160 | sed 's/^/    /'
check "the plan: a host column, the node's host memory, 'fits: yes', the PCIe row and the update" \
  sh -c "test $rc -eq 0 && grep -q '^memory per GPU, GB (1e9 bytes) .*host (pinned)$' '$SCRATCH/one.txt' &&
    grep -q '^  host per node: [0-9.]* GB = 8 GPUs x [0-9.]* GB (stage [0-9]*) against hardware.host_memory_gb = 2048 GB: fits$' '$SCRATCH/one.txt' &&
    grep -q '^  fits: yes (GPU: .*: yes; host: .*: yes)$' '$SCRATCH/one.txt' &&
    grep -qE '^  host \(offload\) +1  PCIe ' '$SCRATCH/one.txt' &&
    grep -q '^  offloaded update .* not implemented\|^  if overlapped .*not implemented' '$SCRATCH/one.txt'"
"$TESSERA" plan "$big" --nodes 1 --gpus-per-node 8 "${LAY[@]}" parallel.offload=optimizer \
  --json >"$SCRATCH/one.json" 2>&1
"$TESSERA" plan "$big" --nodes 1 --gpus-per-node 8 "${LAY[@]}" parallel.offload=none \
  --json >"$SCRATCH/zero.json" 2>&1
ZS=$(printf '%s\n' "${LAY[@]}" | sed -n 's/^parallel.zero_stage=//p')
check "the JSON: device 12 B and host 18 B a parameter of the shard (ZeRO 2-3: and the gradient shard's 8 B), 4 + 2 B over PCIe, 30 B through the CPU" \
  "$PYTHON_REF" - "$SCRATCH/one.json" "$SCRATCH/zero.json" "$ZS" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
zs = int(sys.argv[3])
ok = True
for st_a, st_b in zip(a['stages'], b['stages']):
    g, n, o = st_a['memory_gpu'], st_b['memory_gpu'], st_a['offload']
    h = g['host']
    own = h['master'] / 4                      # elements of the stage's shard
    # ZeRO 2-3 (dp_replicate 1): the reduced gradient on the host; the device loses its fp32
    # shard and landing area (8 B) for three landing areas of the largest unit piece (12 B),
    # each with its host copy (12 B on the host)
    piece = (h['grads'] - 4 * own) / 12 if zs >= 2 else 0
    ok &= 0 <= piece <= own and (piece > 0) == (zs >= 2)
    ok &= abs(n['total'] - g['total'] - (12 * own + (8 * own - 12 * piece if zs >= 2 else 0))) <= 1e-6 * n['total']
    ok &= abs(h['total'] - 18 * own - 12 * piece) <= 1
    ok &= max(abs(x - y) for x, y in zip([h['master'], h['optim'], h['grads'], h['staging']],
                                         [4 * own, 8 * own, 4 * own + 12 * piece, 2 * own])) <= 1
    ok &= st_a['memory_cpu_build']['total'] == st_b['memory_cpu_build']['total']
    ok &= abs(o['d2h_bytes'] - 4 * own) <= 1 and abs(o['h2d_bytes'] - 2 * own) <= 1
    ok &= abs(o['cpu_bytes'] - 30 * own) <= 2
    ok &= abs(o['d2h_s'] - o['d2h_bytes'] / 50e9) <= 1e-5 * o['d2h_s']   # printed to 6 digits
    rate = min(11.5 * 112, 394) / 8 * 1e9         # the h100 node's cores over its 8 GPUs
    ok &= abs(o['cpu_s'] - o['cpu_bytes'] / rate) <= 1e-5 * o['cpu_s']
    ok &= abs(o['serial_s'] - (o['d2h_s'] + o['cpu_s'] + o['h2d_s'])) <= 1e-5 * o['serial_s']
    # in pieces of 2^21 elements: the slowest of the three plus one piece of the others;
    # ZeRO 2-3 (the gradient on the host): the last unit's copy, then the CPU's AdamW and
    # the copy back pipelined; ZeRO-3 behind the next step's first forward
    share = min(2 ** 21, own) / own
    t3 = [o['d2h_s'], o['cpu_s'], o['h2d_s']]
    ok &= abs(o['pipelined_s'] - (max(t3) + (sum(t3) - max(t3)) * share)) <= 1e-5 * o['pipelined_s']
    ok &= o['case'] == ['device_grads', 'device_grads', 'host_grads', 'host_grads'][zs]
    if zs < 2:
        want = max(0, o['pipelined_s'] - o['first_forward_s'])
    else:
        t2 = [o['cpu_s'], o['h2d_s']]
        upd = max(t2) + min(t2) * share
        last = o['d2h_s'] / o['units']
        pp = a['layout']['pp']                # units: layers, the embedding, the head
        ok &= o['units'] == st_a['layers'] + (st_a['stage'] == 0) + (st_a['stage'] == pp - 1)
        want = last + max(0, upd - o['first_forward_s'])
        # the host's own gradient work: 12 B an element a micro-batch, 4 B for the norm
        ok &= abs(o['accum_s'] - 12 * own / rate) <= 1e-5 * o['accum_s']
        ok &= abs(o['host_norm_s'] - 4 * own / rate) <= 1e-5 * o['host_norm_s']
        ok &= abs(o['accum_exposed_s'] - o['micro_batches'] * max(0, o['accum_s'] - o['micro_s'])) <= 1e-6
    ok &= abs(o['tail_s'] - want) <= 1e-5 * want
m = a['memory']
u = a['offload']['update']
print(f"    device {m['gpu']['peak'] / 1e9:.2f} GB a GPU (without offload "
      f"{b['memory']['gpu']['peak'] / 1e9:.2f}); host {m['host_per_gpu'] / 1e9:.2f} GB a GPU, "
      f"{m['host_per_node'] / 1e9:.1f} GB a node; update ({u['case']}) {u['tail_s']:.3f} s "
      f"(one after the other {u['serial_s']:.3f}: PCIe {u['d2h_s'] + u['h2d_s']:.3f}, CPU "
      f"{u['cpu_s']:.3f}); step {a['time']['step_s']:.2f} s (also behind the last backward "
      f"{a['offload']['overlapped_step_s']:.2f})")
ok &= m['fits'] and m['fits_host'] and m['host_per_node'] == 8 * m['host_per_gpu']
ok &= not b['memory']['fits'] and a['offload']['offload'] == 'optimizer'
ok &= a['offload']['overlapped_step_s'] <= a['time']['step_s']
ok &= abs(a['offload']['tail_s'] - u['tail_s']) <= 1e-5 * u['tail_s']
sys.exit(0 if ok else 1)
PY

# ---- 3. a node whose host memory cannot hold it
"$TESSERA" plan "$big" --nodes 1 --gpus-per-node 8 "${LAY[@]}" parallel.offload=optimizer \
  hardware.host_memory_gb=1000 --require-fit >"$SCRATCH/small.txt" 2>&1
rc=$?
grep '^  fits\|^  host memory' "$SCRATCH/small.txt" | cut -c1-200 | sed 's/^/    /'
check "hardware.host_memory_gb = 1000: 'fits: NO' (the host), the keys and bytes named, exit $rc = 3" \
  sh -c "test $rc -eq 3 && grep -q '^  fits: NO (GPU: .*: yes; host: .*: NO)$' '$SCRATCH/small.txt' &&
    grep -q \"^  host memory: parallel.offload = 'optimizer' pins [0-9]* bytes (.* GB) a node, 8 GPUs x [0-9]* bytes, more than hardware.host_memory_gb = 1000 GB\" '$SCRATCH/small.txt'"

# ---- 4. bad input
# (on the layout above, which divides: the key is the only problem)
"$TESSERA" plan "$big" --nodes 1 "${LAY[@]}" parallel.offload=optimizer \
  parallel.offload_fraction=1.5 >"$SCRATCH/frac.txt" 2>&1
rc=$?
sed 's/^/    /' "$SCRATCH/frac.txt"
check "parallel.offload_fraction = 1.5: exit $rc = 2, naming the key and its range, nothing planned" \
  sh -c "test $rc -eq 2 && grep -q '&parallel offload_fraction = 1.5 is out of range: must be in \[0, 1\]' '$SCRATCH/frac.txt' &&
    test \$(wc -l <'$SCRATCH/frac.txt') -eq 1"
"$TESSERA" plan "$big" --nodes 1 "${LAY[@]}" parallel.offload=cpu >"$SCRATCH/word.txt" 2>&1
rc=$?
sed 's/^/    /' "$SCRATCH/word.txt"
test $rc -eq 2 || bad "parallel.offload = 'cpu': exit $rc, not 2"
check "parallel.offload = 'cpu': exit 2, naming the key and its choices" \
  grep -q "&parallel offload = 'cpu' is not allowed: choose one of 'none', 'optimizer'" "$SCRATCH/word.txt"

# ---- 5. the activation offload in the search
AO=(--nodes 1 --gpus-per-node 4 model.seq_len=32768 train.global_batch=16)
"$TESSERA" plan "$big" "${AO[@]}" --search --top 3 >"$SCRATCH/act.txt" 2>&1
sed -n '/^search on/,/^  -- these/p' "$SCRATCH/act.txt" | cut -c1-150 | sed 's/^/    /'
"$TESSERA" plan "$big" "${AO[@]}" --search --json >"$SCRATCH/act.json" 2>&1
"$TESSERA" plan "$big" "${AO[@]}" --search --json train.activation_offload=F \
  >"$SCRATCH/act_held.json" 2>&1
check "llm70b at 32768 tokens on 1 x 4 H100: fits only with the activation offload as well; every layout carries both offloads; held off, none fits" \
  "$PYTHON_REF" - "$SCRATCH/act.json" "$SCRATCH/act_held.json" "$SCRATCH/act.txt" <<'PY'
import json, sys
s, h = (json.load(open(f))['search'] for f in sys.argv[1:3])
text = open(sys.argv[3]).read()
l = s['layouts']
print(f"    {s['fit']} fit; the fastest: tp {l[0]['tp']} cp {l[0]['cp']} zero {l[0]['zero_stage']} "
      f"{l[0]['recompute']}, {l[0]['memory_gb']:.1f} GB a GPU, {l[0]['host_gb_per_node']:.0f} GB host "
      f"a node, step {l[0]['step_s']:.1f} s; held off: {h['fit']} fit")
ok = s['offload_searched'] and s['act_offload_searched'] and s['fit'] > 0 and l
ok = ok and all(x['activation_offload'] and x['offload'] == 'optimizer' and x['fits'] and
                0 < x['host_gb_per_node'] < 2048 for x in l)
ok = ok and h['fit'] == 0 and h['offload_searched'] and not h['act_offload_searched']
ok = ok and h['fixed'].get('train.activation_offload') in ('F', '.false.')
ok = ok and '\nactivation offload tried as well, as nothing fits with the optimizer offload alone' in text
sys.exit(0 if ok else 1)
PY
L=$("$PYTHON_REF" -c "
import json, sys
x = json.load(open(sys.argv[1]))['search']['layouts'][0]
print(f\"parallel.tp={x['tp']} parallel.cp={x['cp']} parallel.cp_comm={x['cp_comm']} parallel.pp={x['pp']} \"
      f\"parallel.virtual_stages={x['virtual_stages']} parallel.schedule={x['schedule']} \"
      f\"parallel.zero_stage={x['zero_stage']} train.micro_batch={x['micro_batch']} \"
      f\"train.recompute={x['recompute']} parallel.sequence_parallel={'T' if x['sequence_parallel'] else 'F'} \"
      f\"parallel.offload=optimizer\")" "$SCRATCH/act.json")
read -r -a ALAY <<<"$L"
"$TESSERA" plan "$big" "${AO[@]}" "${ALAY[@]}" train.activation_offload=T >"$SCRATCH/act_one.txt" 2>&1
"$TESSERA" plan "$big" "${AO[@]}" "${ALAY[@]}" train.activation_offload=T --json >"$SCRATCH/act_one.json" 2>&1
"$TESSERA" plan "$big" "${AO[@]}" "${ALAY[@]}" train.activation_offload=F --json >"$SCRATCH/act_off.json" 2>&1
grep '^  host (act offload)\|^  fits:' "$SCRATCH/act_one.txt" | cut -c1-170 | sed 's/^/    /'
check "  ... planned alone: the 'host (act offload)' row; the blocks a step each way = micro-batches x host blocks / slots; without it no fit" \
  "$PYTHON_REF" - "$SCRATCH/act_one.json" "$SCRATCH/act_off.json" "$SCRATCH/act_one.txt" <<'PY'
import json, re, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
text = open(sys.argv[3]).read()
ok = a['memory']['fits'] and not b['memory']['fits'] and a['act_offload']['on'] and not b['act_offload']['on']
m = a['layout']['micro_batches']
for st in a['stages']:
    g, x = st['memory_gpu'], st['act_offload']
    want = m * g['host']['acts'] / g['in_flight']
    ok &= want > 0 and abs(x['bytes_to_host'] - want) <= 1e-9 * want and x['bytes_back'] == x['bytes_to_host']
r = re.search(r"^  host \(act offload\) +1  PCIe +([0-9.]+) ", text, re.M)
ok = ok and r is not None and abs(float(r.group(1)) * 1e9 - 2 * a['act_offload']['bytes_to_host']) <= 1e-4 * 2 * a['act_offload']['bytes_to_host']
print(f"    {a['act_offload']['bytes_to_host'] / 1e9:.1f} GB each way a step, {a['act_offload']['pcie_s']:.2f} s "
      f"of PCIe, {a['act_offload']['exposed_s']:.3f} s not hidden; {a['memory']['gpu']['peak'] / 1e9:.2f} GB a GPU "
      f"(without: {b['memory']['gpu']['peak'] / 1e9:.2f})")
sys.exit(0 if ok else 1)
PY
for held in "" train.activation_offload=T; do
  "$TESSERA" plan "$top_srcdir/input/llm7b.nml" --nodes 1 --gpus-per-node 8 --search --json \
    --top 100000 $held >"$SCRATCH/zb${held:+_held}.json" 2>&1
done
check "llm7b on 1 x 8: with train.activation_offload held on, zero-bubble layouts are proposed too" \
  "$PYTHON_REF" - "$SCRATCH/zb.json" "$SCRATCH/zb_held.json" <<'PY'
import json, sys
s, h = (json.load(open(f))['search']['layouts'] for f in sys.argv[1:3])
zb = lambda l: sum(x['schedule'].startswith('zb') for x in l)
print(f"    without it {len(s)} fit, {zb(s)} zero-bubble; held on {len(h)} fit, {zb(h)} zero-bubble")
sys.exit(0 if zb(s) > 0 and zb(h) > 0 and all(x['activation_offload'] for x in h) else 1)
PY
L=$("$PYTHON_REF" -c "
import json, sys
x = [x for x in json.load(open(sys.argv[1]))['search']['layouts'] if x['schedule'] == 'zb_h1'][0]
print(f\"parallel.tp={x['tp']} parallel.pp={x['pp']} parallel.virtual_stages={x['virtual_stages']} \"
      f\"parallel.schedule={x['schedule']} parallel.zero_stage={x['zero_stage']} \"
      f\"train.micro_batch={x['micro_batch']} train.recompute={x['recompute']} \"
      f\"parallel.sequence_parallel={'T' if x['sequence_parallel'] else 'F'}\")" "$SCRATCH/zb_held.json")
read -r -a ZLAY <<<"$L"
"$TESSERA" plan "$top_srcdir/input/llm7b.nml" --nodes 1 --gpus-per-node 8 "${ZLAY[@]}" \
  train.activation_offload=T --json >"$SCRATCH/zb_one.json" 2>&1
check "  ... one planned alone (${ZLAY[*]}): every block goes each way twice (after B, for W)" \
  "$PYTHON_REF" - "$SCRATCH/zb_one.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
x, m = a['act_offload'], a['layout']['micro_batches']
print(f"    {x['bytes_to_host'] / 1e9:.2f} GB to the host a step, {x['bytes_back'] / 1e9:.2f} GB back")
ok = x['on'] and x['bytes_to_host'] > 0 and x['bytes_back'] == x['bytes_to_host']
st = [s for s in a['stages'] if s['stage'] == x['stage']][0]
g = st['memory_gpu']
want = 2 * m * g['host']['acts'] / g['in_flight']
sys.exit(0 if ok and abs(x['bytes_to_host'] - want) <= 1e-9 * want else 1)
PY

# ---- 6. the trainer on the emulated GPU
if ! command -v g++ >/dev/null || ! command -v "$MPIRUN" >/dev/null 2>&1 ||
  [ ! -d /usr/share/games/fortunes ]; then
  echo "SKIP: the emulated GPU (needs g++, mpirun and fortunes)"
  finish
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 TSR_GEMM_PROBE_N=64
# hybrid replicas at ZeRO-3 with the optimizer offloaded: the replicas' all-reduce of the
# offloaded gradient runs over host memory, a row of its own under dp_replicate and in the
# JSON; without the offload it stays on the network
HY=(--nodes 2 --gpus-per-node 8 parallel.tp=1 parallel.pp=1 parallel.zero_stage=3
  "parallel.shard_scope='node'")
"$TESSERA" plan "$top_srcdir/input/llm7b.nml" "${HY[@]}" "parallel.offload='optimizer'" >"$SCRATCH/hy.txt" 2>&1
"$TESSERA" plan "$top_srcdir/input/llm7b.nml" "${HY[@]}" "parallel.offload='optimizer'" --json \
  >"$SCRATCH/hy.json" 2>&1
"$TESSERA" plan "$top_srcdir/input/llm7b.nml" "${HY[@]}" --json >"$SCRATCH/hy0.json" 2>&1
grep -E '^  (dp_replicate|  host part)' "$SCRATCH/hy.txt" | cut -c1-110 | sed 's/^/    /'
check "llm7b ZeRO-3 on 2 nodes, 2 replicas, offloaded: the all-reduce over host memory, slower than the network's" \
  "$PYTHON_REF" - "$SCRATCH/hy.json" "$SCRATCH/hy0.json" "$SCRATCH/hy.txt" <<'PY'
import json, re, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
o, o0 = a['stages'][0]['offload'], b['stages'][0]['offload']
own = a['stages'][0]['memory_gpu']['host']['master'] / 4
txt = open(sys.argv[3]).read()
ok = o['case'] == 'host_grads' and abs(o['replica_host_bytes'] - 4 * own) <= 4
ok &= o0['replica_host_bytes'] == 0 and o0['replica_host_s'] == 0
# at least the network's time for the same bytes (50 GB/s a GPU), and its row in the table
ok &= o['replica_host_s'] >= o['replica_host_bytes'] / 50e9
m = re.search(r'^    host part +host +([0-9.]+) +([0-9.]+)', txt, re.M)
ok &= bool(m) and abs(float(m.group(2)) - o['replica_host_s']) <= 1e-4
sys.exit(0 if ok else 1)
PY
EMU="$SCRATCH/tessera-emu"
emu_link tessera "$EMU"
bytes_corpus computers
C=(model.vocab_size=256 model.n_layer=2 model.d_model=32 model.n_head=2 model.n_kv_head=1
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.log_every=1
  run.eval_every=0 "data.train=$SCRATCH/data/train_*.bin" run.max_steps=1
  checkpoint.every_steps=0 checkpoint.resume=none train.xent_chunk_tokens=8
  train.precision=bf16 parallel.offload=optimizer run.device=cuda run.gpu_share=.true.)
run() { # run NAME NP ARGS...: its exit code
  local name=$1 np=$2
  shift 2
  timeout 600 "$MPIRUN" -np "$np" "$EMU" /dev/null "${C[@]}" run.out_dir="$SCRATCH/$name" "$@" \
    >"$SCRATCH/$name.out" 2>&1
}
for case in "one 1" "z3 2 parallel.zero_stage=3"; do
  read -r name np args <<<"$case"
  run "$name" "$np" $args
  rc=$?
  grep '^memory at step 1' "$SCRATCH/$name.out" | cut -c1-240 | sed 's/^/    /'
  check "emulated GPU, $name: exit $rc; device and page-locked host memory within 10% of the plan's columns" \
    "$PYTHON_REF" - "$SCRATCH/$name.out" "$rc" <<'PY'
import re, sys
log, rc = open(sys.argv[1]).read(), sys.argv[2]
m = re.search(r"^memory at step 1, most on any rank: in use ([0-9.]+) MB, peak [0-9.]+ MB \| planned "
              r"on a GPU \(bf16 storage\): ([0-9.]+) MB .* \| page-locked host memory of the "
              r"optimizer offload: ([0-9.]+) MB, planned ([0-9.]+) MB", log, re.M)
if rc != '0' or not m:
    sys.exit(1)
use, plan, host, hplan = map(float, m.groups())
sys.exit(0 if abs(plan / use - 1) <= 0.10 and abs(hplan / host - 1) <= 0.10 and host > 0 else 1)
PY
done
TSR_FAULT=offload_host_mb=1 run nohost 2
rc=$?
grep "parallel.offload = 'optimizer': the" "$SCRATCH/nohost.out" | head -n 1 | fold -w 150 | sed 's/^/    /'
check "a node with 1 MB for it: exit $rc = 2 before any step, naming parallel.offload and the bytes" \
  sh -c "test $rc -eq 2 &&
    grep -q \"parallel.offload = 'optimizer': the 2 ranks of a node would pin [0-9]* bytes .* more than the 1000000 bytes\" '$SCRATCH/nohost.out' &&
    ! grep -q '^step ' '$SCRATCH/nohost.out'"
finish
