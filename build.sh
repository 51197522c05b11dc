#!/usr/bin/env bash
# build.sh — install the packages, configure (once) and build.  Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")"
tools/install-deps.sh
# cuDNN attention's frontend headers, where there is a CUDA toolkit (optional: without them
# configure leaves cuDNN attention out, with a warning)
if command -v nvcc >/dev/null; then
  tools/fetch-cudnn-frontend.sh || echo "build: cuDNN frontend not fetched; cuDNN attention left out"
fi
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure ${TSR_CONFIGURE_FLAGS:-}
make -j"$(nproc)"
