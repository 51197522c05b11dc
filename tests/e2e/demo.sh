#!/usr/bin/env bash
# demo.sh — the README's first command, ./run-demo.sh, as a new user runs it once the tree
# is built (its package check and build then only confirm what is there), with its output
# directed to scratch (run.out_dir, which the script hands to both runs and the
# evaluation): the fortunes corpus, steps 1-150 on tp 2 x pp 2, the stop, steps 151-300
# resumed on dp 2 x tp 2 with ZeRO-1 from the step-150 checkpoint, then `tessera eval` of
# the last checkpoint.  Checks what the README says the demo shows: the two layouts, the
# resume, the sample stream going on without a gap, the validation loss falling, the
# evaluation's line.  It writes data/fortunes/ in the source tree, as the demo does.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
[ "$(cd "$top_srcdir" && pwd -P)" = "$(cd "$top_builddir" && pwd -P)" ] ||
  skip "run-demo.sh runs the source tree's src/tessera: an out-of-tree build has none"
OUT="$SCRATCH/demo"
( cd "$top_srcdir" && timeout 900 ./run-demo.sh "run.out_dir=$OUT" ) >"$SCRATCH/demo.out" 2>&1
rc=$?
tail -n 3 "$SCRATCH/demo.out" | sed 's/^/    /'
check "./run-demo.sh run.out_dir=... exits 0 and names where its output went" \
  sh -c "test $rc -eq 0 && grep -qF 'run-demo: log $OUT/tessera.log' '$SCRATCH/demo.out'"
grep -E '"val_loss"|"event"' "$OUT/metrics.jsonl" 2>/dev/null | cut -c1-150 | sed 's/^/    /'
check "metrics.jsonl: steps 1-300, resumed at 150 from step_00000150.h5, tokens without a gap, validation loss falling" \
  "$PYTHON_REF" - "$OUT/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = {}
for r in rows:
    if 'loss' in r and 'step' in r:
        steps[r['step']] = r              # after a resume the later line counts
val = {r['step']: r['val_loss'] for r in rows if 'val_loss' in r}
res = [r for r in rows if r.get('event') == 'resume']
ok = sorted(steps) == list(range(1, 301))
ok &= len(res) == 1 and res[0]['step'] == 150 and 'step_00000150.h5' in res[0]['detail']
# tokens = step x global_batch x seq_len on both layouts
per = steps[1]['tokens'] if ok else 0
ok &= per > 0 and all(steps[s]['tokens'] == s * per for s in steps)
ok &= set(val) >= {50, 150, 300} and val[300] < val[150] < val[50]
sys.exit(0 if ok else 1)
PY
check "the log: the first run on tp 2 x pp 2, the second on dp 2 x tp 2 with ZeRO-1, resharding the checkpoint" \
  "$PYTHON_REF" - "$OUT/tessera.log" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
grids = re.findall(r'grid: world 4 = tp (\d+) x dp (\d+) x pp (\d+) ', log)
zero = re.findall(r'zero stage (\d+):', log)
ok = len(grids) == 2 and grids[0] == ('2', '1', '2') and grids[1] == ('2', '2', '1')
ok &= len(zero) == 2 and zero[1] == '1'
ok &= bool(re.search(r'resumed from \S*step_00000150\.h5 at step 150', log))
sys.exit(0 if ok else 1)
PY
check "tessera eval of the last checkpoint: its line in eval.jsonl, a finite loss below ln 2048" \
  "$PYTHON_REF" - "$OUT/eval.jsonl" <<'PY'
import json, math, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
sys.exit(0 if r.get('step') == 300 and math.isfinite(r['val_loss']) and r['val_loss'] < math.log(2048) else 1)
PY
finish
