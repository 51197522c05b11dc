#!/usr/bin/env bash
# run-demo.sh — fresh machine to a trained tiny model: install, build, make the fortunes
# corpus (SentencePiece BPE, 2048 pieces), then train the built-in default deck
# (input/tiny.nml) on 4 MPI ranks over all three parallel dimensions, with a restart
# on another layout half-way, and evaluate the last checkpoint:
#   steps   1-150  tp 2 x pp 2 (1F1B, 4 micro-batches per step), then checkpoint and stop
#   steps 151-300  resumed from that checkpoint on dp 2 x tp 2 with ZeRO-1 (the checkpoint
#                  reshards on load; the sample stream continues where it stopped)
# Output under out/tiny/ (log, metrics.jsonl, ckpt/).  Extra arguments (group.key=value)
# go to both runs and to the evaluation: run.out_dir=DIR puts all of it in DIR.
set -euo pipefail
cd "$(dirname "$0")"
./build.sh
tools/fortunes-corpus.sh data/fortunes 2048
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# one LR schedule over both halves: decay over 300 steps whatever max_steps the run has
common=(input/tiny.nml optim.decay_steps=300 "$@")
mpirun -np 4 src/tessera "${common[@]}" parallel.tp=2 parallel.pp=2 run.max_steps=150
mpirun -np 4 src/tessera "${common[@]}" parallel.tp=2 parallel.zero_stage=1 run.max_steps=300
src/tessera eval input/tiny.nml "$@"
out=out/tiny
for a in "$@"; do case $a in run.out_dir=*) out=${a#run.out_dir=} out=${out//\'/} ;; esac; done
echo "run-demo: log $out/tessera.log, metrics $out/metrics.jsonl, checkpoints $out/ckpt/"
