#!/usr/bin/env bash
# plan_cp.sh — `tessera plan` with context parallelism (parallel.cp; docs/context_parallel.md
# "What the planner counts"), on the shipped long-context deck input/llama3_8b_128k.nml
# (Llama 3 8B shapes, 131072-token sequences, tp 4 x cp 4 x dp 4) on 8 nodes of 8 H100s.
# Nothing is trained: the planner alone, a few seconds.
#  1. The deck's plan fits (--require-fit exits 0) and its tables say how: the layout line
#     with cp, the context line (2 x 4 chunks of 16384 tokens, 32768 per rank), the cp
#     row of the traffic table; no warning about the batch (dp = 64 / (tp cp pp) = 4, not
#     64 / (tp pp) = 16, so 8 sequences are not "below one per dp rank" either).
#  2. Its JSON: the layout's cp and cp_comm, the cp group's bytes per step by the ring's
#     formula counted here from the deck's shapes (K and V of a rank's tokens cp - 1 hops
#     forward and backward, the fp32 dK, dV cp hops, per layer and micro-batch), the
#     ZeRO group over dp x cp = 16 ranks; without cp (tp 4 on 64 GPUs) it does not fit.
#  3. --search tries cp for this seq_len: layouts fit, every one of them with cp > 1, the
#     deck's own among them; the table says cp was tried and shows the cp column.  A
#     held parallel.cp=8 holds the search to cp 8.  On a 4096-token deck that fits
#     (llm7b on 8 nodes) the search tries no cp.
#  4. Layouts that do not divide: exit 2, naming the keys and numbers: seq_len not
#     divisible by 2 cp, a world that is not a multiple of tp cp pp, a2a with cp not
#     dividing the tp-local heads.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
[ -x "$TESSERA" ] || skip "no $TESSERA"
scratch
D="$top_srcdir/input/llama3_8b_128k.nml"

# ---- 1. the deck's plan
"$TESSERA" plan "$D" --nodes 8 --gpus-per-node 8 --require-fit >"$SCRATCH/plan.txt" 2>&1
rc=$?
sed -n '/^layout/,/^checks/p;/^  activations/p;/^  fits/p;/^traffic/,/^$/p' "$SCRATCH/plan.txt" | sed 's/^/    /'
check "llama3_8b_128k on 8 x 8 H100: exit $rc with --require-fit, 'fits: yes'" \
  test $rc -eq 0 -a -n "$(grep '^  fits: yes' "$SCRATCH/plan.txt")"
check "  ... layout 'tp 4 x cp 4 x dp 4 x pp 1', 2 x 4 chunks of 16384 tokens, 32768 per rank" \
  sh -c "grep -q '^layout   tp 4 x cp 4 x dp 4 x pp 1,' '$SCRATCH/plan.txt' &&
    grep -q '^context  cp 4 (p2p: a ring of K/V blocks): each sequence in 2 x 4 chunks of 16384 tokens, a cp rank holding 2 of them, 32768 tokens' '$SCRATCH/plan.txt' &&
    grep -q 'seq_len 131072 by 2 cp 8' '$SCRATCH/plan.txt'"
check "  ... the traffic table has the cp group (4 ranks, between nodes: tp x cp = 16 > 8)" \
  grep -qE '^  cp +4  inter-node .* send [0-9.]+, recv [0-9.]+$' "$SCRATCH/plan.txt"
"$TESSERA" plan "$D" --nodes 8 train.global_batch=8 >"$SCRATCH/gb8.txt" 2>&1
rc8=$?
check "  ... no batch warning, also at 8 sequences (dp is 64 / (tp cp pp) = 4)" \
  test $rc -eq 0 -a $rc8 -eq 0 -a -z "$(grep '^warning' "$SCRATCH/plan.txt" "$SCRATCH/gb8.txt")"

# ---- 2. the JSON: cp traffic by the formula, ZeRO over dp x cp
"$TESSERA" plan "$D" --nodes 8 --json >"$SCRATCH/plan.json" 2>&1
"$TESSERA" plan "$D" --nodes 8 --json parallel.cp=1 >"$SCRATCH/nocp.json" 2>&1
check "the JSON: cp 4 p2p, its traffic = the ring's formula, ZeRO over dp x cp 16; cp 1 does not fit" \
  "$PYTHON_REF" - "$SCRATCH/plan.json" "$SCRATCH/nocp.json" <<'PY'
import json, sys
d, n = (json.load(open(f)) for f in sys.argv[1:3])
lay, st = d['layout'], d['stages'][0]
L, B, T, KV, tp, hd, cp = 32, 1, 131072, 8, 4, 128, 4
k = 16 // lay['dp']                     # micro-batches per dp rank
N = B * T // cp                          # a cp rank's tokens
kv = 2 * N * (KV // tp) * hd             # its K and V, elements
want = k * L * ((cp - 1) * kv * 2 + (cp - 1) * kv * 2 + cp * kv * 4)  # bf16 K, V; fp32 dK, dV
t = st['traffic']
print(f"    cp group: send {t['cp']['send']/1e9:.4f} GB, recv {t['cp']['recv']/1e9:.4f} GB; "
      f"by hand {want/1e9:.4f} GB; dp_shard {t['dp_shard']['size']} ranks; "
      f"cp 1: {n['memory']['gpu']['peak']/1e9:.1f} GB")
ok = lay['cp'] == 4 and lay['cp_comm'] == 'p2p' and lay['dp'] == 4 and lay['shard'] == 16
ok &= t['cp']['size'] == 4 and t['cp']['send'] == want and t['cp']['recv'] == want
ok &= t['cp']['link'] == 'inter-node' and t['dp_shard']['size'] == 16 and 'dp_cp' in t
ok &= d['memory']['fits'] and not n['memory']['fits'] and n['layout']['dp'] == 16
sys.exit(0 if ok else 1)
PY

# ---- 3. the search
"$TESSERA" plan "$D" --nodes 8 --search --top 5 >"$SCRATCH/search.txt" 2>&1
rc=$?
sed -n '/^search on/,$p' "$SCRATCH/search.txt" | sed 's/^/    /'
check "--search on 8 x 8: exit $rc, cp tried, the table's cp column, the deck's layout fits" \
  sh -c "test $rc -eq 0 && grep -q '^context parallelism tried: cp a power of 2 dividing model.seq_len = 131072' '$SCRATCH/search.txt' &&
    grep -qE '^ +rank +tp +pp +v schedule +dp cp ' '$SCRATCH/search.txt' &&
    grep -qE '^ +[0-9]+ +4 +1 +1 1f1b +4 4/p2p ' '$SCRATCH/search.txt' &&
    grep -q \"the deck's own layout (fits\" '$SCRATCH/search.txt'"
"$TESSERA" plan "$D" --nodes 8 --search --json --top 100000 >"$SCRATCH/search.json" 2>&1
"$TESSERA" plan "$D" --nodes 8 --search --json --top 100000 parallel.cp=8 >"$SCRATCH/cp8.json" 2>&1
"$TESSERA" plan "$top_srcdir/input/llm7b.nml" --nodes 8 --search --json --top 100000 \
  >"$SCRATCH/short.json" 2>&1
check "  ... layouts fit, all with cp > 1 (no cp 1 fits), the deck's among them; held cp 8: all cp 8; llm7b: no cp tried" \
  "$PYTHON_REF" - "$SCRATCH/search.json" "$SCRATCH/cp8.json" "$SCRATCH/short.json" <<'PY'
import json, sys
s, h, short = (json.load(open(f))['search'] for f in sys.argv[1:4])
L = s['layouts']
cps = sorted({(l['cp'], l['cp_comm']) for l in L})
print(f"    {s['fit']} of {s['divide']} layouts fit, cp values {cps}; deck rank {s['deck']['rank']}; "
      f"held cp 8: {h['fit']} fit; llm7b: {short['fit']} fit, cp searched {short['cp_searched']}")
ok = s['cp_searched'] and s['fit'] > 0 and len(L) == s['fit'] and all(l['fits'] for l in L)
ok &= all(l['cp'] > 1 for l in L) and s['deck']['fits'] and s['deck']['cp'] == 4
ok &= all(l['tp'] * l['cp'] * l['pp'] * l['dp'] == 64 for l in L)
ok &= h['fixed'] == {'parallel.cp': '8'} and h['layouts'] and all(l['cp'] == 8 for l in h['layouts'])
ok &= not short['cp_searched'] and short['fit'] > 0 and all(l['cp'] == 1 for l in short['layouts'])
sys.exit(0 if ok else 1)
PY

# ---- 4. layouts that do not divide: exit 2, naming the keys
bad_layout() { # bad_layout NAME WANT ARGS...: exit 2 and WANT in the output
  local name=$1 want=$2
  shift 2
  "$TESSERA" plan "$D" "$@" >"$SCRATCH/$name.txt" 2>&1
  local rc=$?
  check "$name: exit $rc (2), '$want'" test $rc -eq 2 -a -n "$(grep -F "$want" "$SCRATCH/$name.txt")"
}
bad_layout "seq_len 131076 with cp 4" \
  "model.seq_len = 131076 is not divisible by 2 * parallel.cp = 4" --nodes 8 model.seq_len=131076
bad_layout "one node of 8 for tp 4 x cp 4" \
  "world size 8 is not a multiple of parallel.tp = 4" --nodes 1
grep -q "parallel.cp = 4 (set at .*) \* parallel.pp = 1 = 16" "$SCRATCH/one node of 8 for tp 4 x cp 4.txt" ||
  bad "  ... the message names parallel.cp and the product 16"
bad_layout "a2a with cp 16 over 8 heads of a tp rank" \
  "to divide the query heads of a tp rank, model.n_head = 32" --nodes 8 parallel.cp=16 \
  parallel.cp_comm=a2a
finish
