#!/bin/bash
# deck_cli.sh — the trainer's command line around the deck: `tessera --help-deck` (every
# stable key under its group, the choice keys' words), a bad deck
# exits 2 with `file:line:col:`, a misspelt override gets "did you mean", and a bad override
# value is located as `<command line>:argN:col`; `eval --help` is the usage, an unknown option
# is named as one (not looked for as a deck), and `tessera train DECK` or a misspelt
# subcommand says what was meant.  Exit 0 pass, 1 fail, 77 skip (no binary).
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
if [ ! -x "$top_builddir/src/tessera" ]; then
  echo "SKIP: $top_builddir/src/tessera is not built"
  exit 77
fi
bin=$(cd "$top_builddir" && pwd)/src/tessera
deck=$(cd "$top_srcdir" && pwd)/input/tiny.nml
tmp=$(mktemp -d "${TMPDIR:-/tmp}/deck_cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fail=0

# expect NAME RC PATTERN -- COMMAND...: COMMAND exits RC and its output contains PATTERN.
expect() {
  local name=$1 want_rc=$2 pattern=$3
  shift 4
  local out rc
  out=$(timeout 120 "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq "$want_rc" ] && grep -qF -- "$pattern" <<<"$out"; then
    echo "PASS: $name"
  else
    echo "FAIL: $name (exit $rc, wanted $want_rc and '$pattern')"
    sed 's/^/    /' <<<"$out" | head -20
    fail=1
  fi
}

expect "--help-deck lists micro_batch" 0 "micro_batch" -- "$bin" --help-deck
expect "--help-deck lists rope_theta" 0 "rope_theta" -- "$bin" --help-deck
"$bin" --help-deck >help.txt 2>&1
# each group's columns line up, its longest key included (attention_fp32_bwd_efficiency)
misaligned=$(awk '/^&/ { w = 0; next }
  /^  [^ ]/ { match($0, /^  [^ ]+ +/); if (w == 0) w = RLENGTH; else if (RLENGTH != w) print $1 }' help.txt)
if [ -z "$misaligned" ] && grep -q '^  attention_fp32_bwd_efficiency ' help.txt; then
  echo "PASS: --help-deck: every group's type column at one offset"
else
  echo "FAIL: --help-deck: keys whose columns do not line up: $misaligned"
  fail=1
fi

# The deck keys other tools and job scripts rely on, by group, and the words of the choice
# keys among them: each must stay listed under its group with every word (a rename or a
# dropped word breaks decks and scripts in the field).
stable_keys="run.name run.out_dir run.seed run.max_steps run.log_every run.eval_every
  run.eval_steps run.step_timeout_s model.arch model.n_layer model.d_model model.n_head
  model.n_kv_head model.d_ff model.vocab_size model.seq_len model.rope_theta model.norm_eps
  model.tie_embeddings model.rope_scaling model.rope_factor model.rope_low_freq_factor
  model.rope_high_freq_factor model.rope_original_context model.max_positions parallel.tp
  parallel.pp parallel.cp parallel.cp_comm parallel.offload parallel.zero_stage
  parallel.shard_scope parallel.ranks_per_node parallel.schedule parallel.micro_batches
  parallel.virtual_stages parallel.sequence_parallel train.micro_batch train.global_batch
  train.precision train.recompute train.grad_clip train.activation_offload optim.lr
  optim.min_lr optim.warmup_steps optim.decay optim.decay_steps optim.beta1 optim.beta2
  optim.eps optim.weight_decay data.train data.valid data.shuffle data.weights data.names
  data.document_mask checkpoint.dir checkpoint.every_steps checkpoint.every_minutes
  checkpoint.keep checkpoint.resume checkpoint.save_initial checkpoint.init_from"
listed=$(awk '/^&[a-z]/ { g = substr($1, 2); next } g && /^  [a-z]/ { print g "." $1 }' help.txt)
missing=""
for k in $stable_keys; do grep -qx -- "$k" <<<"$listed" || missing="$missing $k"; done
if [ -z "$missing" ]; then
  echo "PASS: --help-deck lists every stable key under its group"
else
  echo "FAIL: --help-deck lacks:$missing"
  fail=1
fi
# KEY WORD...: the help line of KEY (under any group) shows each 'WORD'
words() {
  local key=$1 line
  shift
  line=$(grep -E "^  $key +" help.txt | head -1)
  for w in "$@"; do
    grep -qF -- "'$w'" <<<"$line" || { echo "FAIL: --help-deck: $key lacks '$w'"; fail=1; return; }
  done
  echo "PASS: --help-deck: $key takes $*"
}
words arch llama gpt2
words precision fp32 bf16 fp16
words recompute none selective full
words decay cosine linear wsd constant
words resume auto none
words shard_scope node global
words rope_scaling none llama3
words cp_comm p2p a2a
words offload none optimizer
words schedule gpipe 1f1b interleaved

cat >bad.nml <<'NML'
! line 1: a deck with one bad value
&model
  n_layer = 4
  d_model = 0
/
NML
expect "bad deck: exit 2 at file:line:col" 2 "bad.nml:4:13: &model d_model = 0 is out of range" \
  -- "$bin" bad.nml

cat >unclosed.nml <<'NML'
&run
  name = 'x'
&model
  n_layer = 4
/
NML
expect "unclosed group points at its &run" 2 "unclosed.nml:1:1: group &run is not closed" \
  -- "$bin" unclosed.nml

expect "misspelt override: did you mean" 2 "did you mean 'n_layer'" \
  -- "$bin" "$deck" model.n_layre=3
expect "bad override value: <command line>:arg1:" 2 "<command line>:arg1:10: &optim lr expects a real number" \
  -- "$bin" "$deck" optim.lr=abc
expect "second override is arg2" 2 "<command line>:arg2:" \
  -- "$bin" "$deck" run.max_steps=1 train.micro_batch=0
expect "missing deck file: exit 2, cannot open" 2 "cannot open" \
  -- "$bin" "$tmp/no_such_deck.nml"

# the subcommands' mistakes: each says what to change, none is taken for a deck name
expect "eval --help: the usage, exit 0" 0 "usage: tessera" -- "$bin" eval --help
expect "an unknown option before the deck: named as an option" 2 "unknown option '--bogus'" \
  -- "$bin" --bogus "$deck"
expect "eval's unknown option: eval's one option named" 2 "its one option is --tokenizer" \
  -- "$bin" eval "$deck" --tokens 5
expect "eval with only its option: needs a deck" 2 "tessera eval needs a deck" \
  -- "$bin" eval --tokenizer x.model
expect "tessera train DECK: no such subcommand, said so" 2 "training takes no subcommand" \
  -- "$bin" train "$deck"
expect "a misspelt subcommand: did you mean" 2 "did you mean the subcommand 'eval'?" \
  -- "$bin" evl "$deck"
expect "a shortened subcommand: did you mean" 2 "did you mean the subcommand 'generate'?" \
  -- "$bin" gen "$deck"

exit $fail
