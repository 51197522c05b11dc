#!/usr/bin/env bash
# readme_example.sh — README.md's blocks on data and imported models, run as written
# (tests/lib.sh readme_block), each in a scratch directory of its own set up as the top of
# a source tree (readme_tree: the tree's tools/ and input/, the built trainer as
# src/tessera and as `tessera` on PATH) that holds the inputs the block names.  Only
# appended overrides and options change them:
#   own-data   "Train on your own text": a 400 KB text under the name the block uses; the
#              training run stops at step 20 (run.max_steps appended).  The one input file
#              is cut into paragraphs with a validation split, the run writes the step-20
#              checkpoint and a finite validation loss below the first training loss, and
#              tessera eval repeats it.
#   mixture    "Several datasets", in own-data's directory after it (it encodes a second
#              text with the first one's model): the run stops at step 20 (run.max_steps
#              appended); the log lists both datasets with their weights, metrics.jsonl
#              counts the samples of each at the weights (within 1%), and the last
#              evaluation's val_losses per set (val_loss their weighted total) are what
#              tessera eval gives again.
#   prepare    the three tsr-prepare lines of "Preparing data": book.txt and a second
#              text, a SentencePiece model as llama.model; --vocab-size 512 appended.
#   hf-corpus  "A corpus as it ships": a byte-level BPE saved as gpt2/tokenizer.json and a
#              corpus/ of a .jsonl.zst and a .parquet; the shards of one process and of 8
#              ranks are the same bytes.  Needs the project's .venv as tools/install-deps.sh
#              makes it (tokenizers, pyarrow); without it this block is left out, saying so.
#              apt-get and sudo are stand-ins that fail, so the block installs nothing.
#   import-hf  "Continue from published weights": a small random Llama (2 layers, GQA,
#              the fortunes corpus's SentencePiece model as its tokenizer.model) written as
#              safetensors under hf/Llama-2-7b-hf; --seq-len 64 and run.max_steps=2
#              appended.  tessera eval gives a finite loss and the 8-rank run trains its 2
#              steps from the import.
# Exit 0 pass, 1 fail, 77 skip (no trainer, spm_train or fortunes).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
command -v spm_train >/dev/null || skip "spm_train not installed (apt-get install sentencepiece)"
fortunes=/usr/share/games/fortunes
for f in fortunes computers science; do
  [ -f "$fortunes/$f" ] || skip "$fortunes/$f not found (apt-get install fortunes)"
done
corpus
export OMPI_MCA_mpi_yield_when_idle=1
STEPS=20
TOP=$(cd "$top_srcdir" && pwd)

# ---- own-data ----
W=$SCRATCH/own-data
readme_tree "$W"
readme_block own-data "$SCRATCH/own-data.sh" '^src/tessera input/' "run.max_steps=$STEPS" || finish
# the input: the text file the example names, about 400 KB of prose paragraphs (fortune
# entries with a blank line between them, no '%' lines)
text=$(grep -o '[A-Za-z0-9_.-]*\.txt' "$SCRATCH/own-data.sh" | head -n 1)
check "the example names its text file ($text)" test -n "$text"
cat "$fortunes/fortunes" "$fortunes/computers" "$fortunes/science" |
  awk '/^%$/ { print ""; next } { print }' >"$W/$text"
readme_run own-data "$W" "$SCRATCH/own-data.sh"
check "  ... tsr-prepare cut the one file into paragraphs, with a validation split" \
  grep -q "split by paragraphs" "$SCRATCH/own-data.sh.out"
ck=$(find "$W/out" -path "*/ckpt/step_$(printf %08d $STEPS).h5" 2>/dev/null | head -n 1)
check "  ... the run wrote the checkpoint of step $STEPS (${ck#"$W"/})" test -n "$ck"
metrics=$(find "$W/out" -name metrics.jsonl 2>/dev/null | head -n 1)
check "  ... the run wrote metrics.jsonl" test -n "$metrics"
if [ -n "$metrics" ]; then
  "$PYTHON_REF" - "$metrics" "$(dirname "$metrics")/eval.jsonl" "$STEPS" <<'PY'
import json, math, os, sys
def rows(path):
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
train, evals, steps = rows(sys.argv[1]), rows(sys.argv[2]), int(sys.argv[3])
first = min((r for r in train if "loss" in r), key=lambda r: r["step"])["loss"]
vals = [r["val_loss"] for r in train + evals if "val_loss" in r and r["step"] == steps]
print(f"    step 1 loss {first:.4f}; validation loss at step {steps} "
      f"(the run's, then tessera eval's): {vals}")
ok = (len(vals) == 2 and all(math.isfinite(v) and v < first for v in vals)
      and abs(vals[0] - vals[1]) <= 1e-6 * abs(vals[1]))
sys.exit(0 if ok else 1)
PY
  check "  ... a finite validation loss below the first training loss, the same from tessera eval" \
    test $? = 0
fi

# ---- mixture (in own-data's directory: it encodes its text with that run's model) ----
if readme_block mixture "$SCRATCH/mixture.sh" '^src/tessera input/' "run.max_steps=$STEPS"; then
  notes=$(grep -o '[A-Za-z0-9_.-]*\.txt' "$SCRATCH/mixture.sh" | head -n 1)
  check "the mixture block names its second text ($notes), not the first's" \
    test -n "$notes" -a "$notes" != "$text"
  awk '/^%$/ { print ""; next } { print }' "$fortunes/people" >"$W/$notes"
  readme_run mixture "$W" "$SCRATCH/mixture.sh"
  check "  ... the log lists the two datasets with their weights" \
    test "$(grep -cE "^data: [a-z]+ +.*weight 0\.(7|3)000: " "$SCRATCH/mixture.sh.out")" = 2
  out=$(grep -o 'run\.out_dir=[^ ]*' "$SCRATCH/mixture.sh" | head -n 1 | cut -d= -f2)
  "$PYTHON_REF" - "$W/$out/metrics.jsonl" "$W/$out/eval.jsonl" "$STEPS" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
evals = [json.loads(l) for l in open(sys.argv[2])] if os.path.exists(sys.argv[2]) else []
steps = int(sys.argv[3])
last = [r for r in rows if r.get("step") == steps and "samples" in r]
val = [r for r in rows if r.get("step") == steps and "val_losses" in r]
ok = len(last) == 1 and len(val) == 1 and len(evals) == 1
if ok:
    c, v, e = last[0]["samples"], val[0], evals[0]
    n = sum(c.values())
    share = sorted(x / n for x in c.values())
    print(f"    samples at step {steps}: {c}; val_losses {v['val_losses']}, eval {e.get('val_losses')}")
    ok = (len(c) == 2 and abs(share[0] - 0.3) <= 0.01 * 0.3 and abs(share[1] - 0.7) <= 0.01 * 0.7
          and sorted(v["val_losses"]) == sorted(c) and e.get("val_losses") is not None
          and all(abs(e["val_losses"][k] - x) <= 1e-6 * abs(x) for k, x in v["val_losses"].items())
          and abs(e["val_loss"] - v["val_loss"]) <= 1e-6 * abs(v["val_loss"]))
sys.exit(0 if ok else 1)
PY
  check "  ... samples per dataset at the weights (1%); val_losses per set, the same from tessera eval" \
    test $? = 0
fi

# ---- prepare ----
W=$SCRATCH/prepare
readme_tree "$W"
cp "$fortunes/computers" "$W/book.txt"
cp "$fortunes/science" "$W/notes.txt"
cp "$CORPUS/fortunes.model" "$W/llama.model"
if readme_block prepare "$SCRATCH/prepare.sh" '--tokenizer spm --vocab-size' '--vocab-size 512'; then
  readme_run prepare "$W" "$SCRATCH/prepare.sh"
  check "  ... the last line wrote shards of llama.model's tokens" \
    grep -q 'llama' "$W/data/mytext/train_000.bin"
fi

# ---- hf-corpus ----
W=$SCRATCH/hf-corpus
readme_tree "$W"
VPY=$TOP/.venv/bin/python
if ! "$VPY" - "$TOP/tools/requirements.txt" >/dev/null 2>&1 <<'PY'
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        __import__(name)
        assert version(name) == want
PY
then
  echo "SKIP: README.md's block 'hf-corpus': $TOP/.venv does not hold tools/requirements.txt (run tools/install-deps.sh)"
else
  ln -s "$TOP/.venv" "$W/.venv"
  for c in apt-get sudo; do
    printf '#!/bin/sh\necho "%s: the test installs nothing" >&2\nexit 1\n' "$c" >"$W/bin/$c"
    chmod +x "$W/bin/$c"
  done
  mkdir -p "$W/gpt2" "$W/corpus"
  "$VPY" - "$W" "$fortunes/computers" "$fortunes/science" <<'PY' || bad "making gpt2/tokenizer.json and corpus/"
import json, sys
import pyarrow as pa, pyarrow.parquet as pq, zstandard
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
top, a, b = sys.argv[1:4]
docs = lambda p: [d.strip() for d in open(p, encoding="utf-8", errors="replace").read().split("\n%\n") if d.strip()]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(docs(a) + docs(b), trainers.BpeTrainer(
    vocab_size=600, special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(f"{top}/gpt2/tokenizer.json")
with open(f"{top}/corpus/part-000.jsonl.zst", "wb") as f:
    f.write(zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"text": d}) + "\n" for d in docs(a)).encode()))
pq.write_table(pa.table({"text": docs(b)}), f"{top}/corpus/part-001.parquet")
PY
  # the block writes data/web with one process, then again with 8 ranks; the one-process
  # line is run once more afterwards, and the shards must not change
  if readme_block hf-corpus "$SCRATCH/hf-corpus.sh" &&
    readme_run hf-corpus "$W" "$SCRATCH/hf-corpus.sh"; then
    mkdir "$W/eight" && cp "$W"/data/web/*.bin "$W/eight/"
    grep '^tools/tsr-prepare ' "$SCRATCH/hf-corpus.sh" >"$SCRATCH/hf-one.sh"
    (cd "$W" && bash -eu "$SCRATCH/hf-one.sh") >"$SCRATCH/hf-one.out" 2>&1
    check "  ... the shards of 8 ranks and of one process are the same bytes" \
      sh -c "cd '$W' && ls eight/*.bin >/dev/null && for f in eight/*.bin; do cmp \"\$f\" data/web/\${f#eight/} || exit 1; done"
  fi
fi

# ---- import-hf ----
W=$SCRATCH/import-hf
readme_tree "$W"
cat "$fortunes/computers" "$fortunes/science" | grep -v '^%$' >"$W/corpus.txt"
"$PYTHON_REF" - "$W/hf/Llama-2-7b-hf" <<'PY' || bad "writing a small Llama as safetensors"
import json, os, struct, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d)
C, F, H, KV, L, V = 64, 128, 4, 2, 2, 2048
cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=C,
           intermediate_size=F, num_attention_heads=H, num_key_value_heads=KV,
           num_hidden_layers=L, vocab_size=V, max_position_embeddings=128,
           rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
           hidden_act="silu", torch_dtype="float32")
json.dump(cfg, open(f"{d}/config.json", "w"), indent=1)
rng = np.random.default_rng(5)
w = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C)}
for i in range(L):
    p = f"model.layers.{i}."
    w.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
              p + "self_attn.q_proj.weight": (C, C), p + "self_attn.k_proj.weight": (C * KV // H, C),
              p + "self_attn.v_proj.weight": (C * KV // H, C), p + "self_attn.o_proj.weight": (C, C),
              p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
              p + "mlp.down_proj.weight": (C, F)})
head, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
for name, shape in w.items():
    a = (np.ones(shape) if len(shape) == 1 else 0.05 * rng.standard_normal(shape)).astype("<f4")
    head[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + a.nbytes]}
    blobs.append(a.tobytes())
    off += a.nbytes
h = json.dumps(head).encode()
with open(f"{d}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
cp "$CORPUS/fortunes.model" "$W/hf/Llama-2-7b-hf/tokenizer.model"
if readme_block import-hf "$SCRATCH/import-hf.sh" '^tools/tsr-import ' '--seq-len 64' \
  '^tessera eval ' 'run.eval_steps=2' '^tools/tsr-mpirun ' 'run.max_steps=2 run.eval_steps=1'; then
  readme_run import-hf "$W" "$SCRATCH/import-hf.sh"
  check "  ... tessera eval gave the imported model's loss" \
    grep -q 'val loss [0-9]' "$SCRATCH/import-hf.sh.out"
  check "  ... the 8-rank run started from the import and trained 2 steps" \
    sh -c "grep -q 'initialised from the weights of' '$SCRATCH/import-hf.sh.out' && grep -q '^done: 2 steps' '$SCRATCH/import-hf.sh.out'"
fi
finish
