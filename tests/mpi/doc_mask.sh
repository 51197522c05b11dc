#!/usr/bin/env bash
# doc_mask.sh — document masking (data.document_mask) under every layout, against the
# single-rank masked run (same seed and data, 12 steps, fp32, every step's loss and the
# validation loss within 1e-5 relative, the layout tolerance of tests/mpi/tp.sh and pp.sh):
# tp 2, tp 2 with sequence parallelism, pp 2 under every schedule (1F1B, GPipe,
# interleaved, zb_h1, and zb_v with two chunks per stage: the document starts reach every
# chunk of every stage, forward and backward), dp 2 (zero 1), and gpt2 (learned positions
# restarting at each document) on tp 2 and on pp 2.  The shards hold one document
# per line of two fortune files (tools/tsr-prepare --split-by lines, byte 0 after each), so
# a sequence of 64 bytes holds about two documents; the masked losses must differ from the
# unmasked run's (the mask does something), and the log names the end-of-document id.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
"$top_srcdir/tools/tsr-prepare" --out "$SCRATCH/data" --tokenizer bytes --split-by lines \
  /usr/share/games/fortunes/computers /usr/share/games/fortunes/science >/dev/null ||
  { bad "tsr-prepare"; finish; }
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=4 model.d_model=64 model.n_head=4 model.n_kv_head=2
  model.d_ff=160 model.seq_len=64 train.micro_batch=2 train.global_batch=8 run.max_steps=12
  run.log_every=100 run.eval_every=12 run.eval_steps=2 optim.lr=3e-3 optim.warmup_steps=3
  optim.decay_steps=12 model.init_std=0.05 "data.train=$SCRATCH/data/train_*.bin"
  "data.valid=$SCRATCH/data/valid_*.bin" checkpoint.resume=none checkpoint.every_steps=0
  checkpoint.save_last=.false. data.document_mask=.true.)
run() { launch -n "$2" -t 180 -o "$1" "${@:3}"; } # run NAME NP overrides...
case_() { # case_ DESCRIPTION REF NAME NP overrides...
  local what=$1 ref=$2 name=$3 np=$4; shift 4
  run "$name" "$np" "$@"
  local rc=$?
  check "$what: runs" test $rc -eq 0
  [ $rc -eq 0 ] || tail -5 "$SCRATCH/$name.out"
  same_losses "$ref" "$name" 1e-5
  check "$what: losses (and val loss) == single rank, masked (rel 1e-5)" test $? -eq 0
}
G=(model.arch=gpt2 model.n_kv_head=4)
run ref 1
check "one rank, masked: runs" test -s "$SCRATCH/ref/metrics.jsonl"
check "the log names the end-of-document id (the bytes tokenizer's 0)" \
  grep -q "document masking: documents end with token 0" "$SCRATCH/ref.out"
run plain 1 data.document_mask=.false.
same_losses ref plain 1e-3 >/dev/null
check "the masked losses differ from the unmasked run's" test $? -ne 0
run refg 1 "${G[@]}"

case_ "tp 2" ref tp2 2 parallel.tp=2
case_ "tp 2, sequence parallel" ref sp2 2 parallel.tp=2 parallel.sequence_parallel=.true.
case_ "pp 2, 1F1B" ref pp2 2 parallel.pp=2
case_ "pp 2, GPipe" ref gpipe 2 parallel.pp=2 parallel.schedule=gpipe
case_ "pp 2, interleaved (v 2)" ref inter 2 parallel.pp=2 parallel.schedule=interleaved \
  parallel.virtual_stages=2
case_ "pp 2, zb_h1" ref zbh1 2 parallel.pp=2 parallel.schedule=zb_h1
case_ "pp 2, zb_v (two chunks per stage)" ref zbv 2 parallel.pp=2 parallel.schedule=zb_v \
  parallel.virtual_stages=2
case_ "dp 2, zero 1" ref dp2 2 parallel.zero_stage=1
case_ "gpt2 tp 2" refg tp2g 2 "${G[@]}" parallel.tp=2
case_ "gpt2 pp 2, 1F1B" refg pp2g 2 "${G[@]}" parallel.pp=2
finish
