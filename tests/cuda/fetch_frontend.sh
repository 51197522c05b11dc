#!/usr/bin/env bash
# fetch_frontend.sh — tools/fetch-cudnn-frontend.sh fails safely, against package indexes
# served on the loopback (no network): a wheel missing from the index, a wheel that is not the pinned one
# (sha256), an index that cannot be read: exit 1 with the reason, and no headers left
# behind for configure to pick up; with the headers already there it does not download.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
scratch
fetch="$top_srcdir/tools/fetch-cudnn-frontend.sh"
wheel=$(sed -n 's/^wheel=//p' "$fetch" | sed 's/\$version/'"$(sed -n 's/^version=//p' "$fetch")"'/')
mkdir -p "$SCRATCH/empty/nvidia-cudnn-frontend" "$SCRATCH/wrong/nvidia-cudnn-frontend" \
  "$SCRATCH/wrong/files"
echo '<html><body><a href="../../files/other-1.0-py3-none-any.whl">other</a></body></html>' \
  >"$SCRATCH/empty/nvidia-cudnn-frontend/index.html"
echo "<html><body><a href=\"../files/$wheel#sha256=00\">$wheel</a></body></html>" \
  >"$SCRATCH/wrong/nvidia-cudnn-frontend/index.html"
"$PYTHON_REF" - "$SCRATCH/wrong/files/$wheel" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("include/cudnn_frontend.h", "/* not the real one */\n")
PY
# the indexes over HTTP on the loopback (a folder's index.html, as a simple index serves)
"$PYTHON_REF" -u -m http.server 0 --bind 127.0.0.1 --directory "$SCRATCH" >"$SCRATCH/http.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$SCRATCH"' EXIT
for _ in $(seq 50); do grep -q "port [0-9]" "$SCRATCH/http.log" && break; sleep 0.1; done
port=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$SCRATCH/http.log" | head -1)
[ -n "$port" ] || skip "no local HTTP server ($(cat "$SCRATCH/http.log"))"
index_of() { echo "http://127.0.0.1:$port/$1"; }
try() { # try NAME INDEX: run the script into $SCRATCH/NAME, status and output kept
  env -u http_proxy -u HTTP_PROXY -u https_proxy -u HTTPS_PROXY PYPI_SIMPLE="$2" "$fetch" \
    "$SCRATCH/$1" >"$SCRATCH/$1.out" 2>&1
  echo $? >"$SCRATCH/$1.rc"
  cat "$SCRATCH/$1.out"
}
no_headers() { [ ! -e "$SCRATCH/$1/include" ]; }
rc_is() { [ "$(cat "$SCRATCH/$1.rc")" = "$2" ]; }

try missing "$(index_of empty)"
check "a wheel the index does not list: exit 1, 'is not on', no headers" \
  eval 'rc_is missing 1 && grep -q "is not on" "$SCRATCH/missing.out" && no_headers missing'
try tampered "$(index_of wrong)"
check "a wheel that is not the pinned one: exit 1, both sha256 named, no headers" \
  eval 'rc_is tampered 1 && grep -q "sha256 [0-9a-f]\{64\}, expected c6006556" \
    "$SCRATCH/tampered.out" && no_headers tampered'
try unreachable "file://$SCRATCH/nowhere"
check "an index that cannot be read: exit 1, 'download failed', no headers" \
  eval 'rc_is unreachable 1 && grep -q "download failed" "$SCRATCH/unreachable.out" &&
    no_headers unreachable'
mkdir -p "$SCRATCH/present/include" && echo "/* here */" >"$SCRATCH/present/include/cudnn_frontend.h"
try present "file://$SCRATCH/nowhere"
check "headers already there: exit 0 without reading the index" \
  eval 'rc_is present 0 && grep -q here "$SCRATCH/present/include/cudnn_frontend.h"'
finish
