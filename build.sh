#!/usr/bin/env bash
# build.sh — install the packages, configure (once) and build.  Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")"
tools/install-deps.sh
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure ${TSR_CONFIGURE_FLAGS:-}
make -j"$(nproc)"
