#!/usr/bin/env bash
# run-demo.sh — fresh machine to a trained tiny model: install, build, make the fortunes
# corpus (SentencePiece BPE, 2048 pieces), train the embedded default deck
# (input/tiny.nml) and evaluate its last checkpoint.  Output under out/tiny/.
set -euo pipefail
cd "$(dirname "$0")"
./build.sh
tools/fortunes-corpus.sh data/fortunes 2048
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
src/tessera "$@"
src/tessera eval input/tiny.nml
echo "run-demo: log out/tiny/tessera.log, metrics out/tiny/metrics.jsonl, checkpoints out/tiny/ckpt/"
