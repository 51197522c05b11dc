#!/usr/bin/env bash
# fetch-cudnn-frontend.sh [DIR] — put NVIDIA's cuDNN frontend (the header-only C++ graph
# API over cuDNN's backend, MIT licence) under DIR (default: ext/cudnn-frontend of the
# source tree), for cuda/sdpa_cudnn.cpp.  The headers come from one pinned wheel on PyPI
# (the simple index; no pip needed), checked against its sha256.  Idempotent: returns at
# once when DIR/include/cudnn_frontend.h is there.  Exit status 1 (and a message) when
# the download fails or the wheel is not the pinned one, leaving DIR/include as it was;
# configure then builds without cuDNN attention.  PYPI_SIMPLE: another simple index
# (default https://pypi.org/simple; tests/cuda/fetch_frontend.sh uses file:// ones).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$here/ext/cudnn-frontend}
version=1.32.0
wheel=nvidia_cudnn_frontend-$version-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
[ -f "$dir/include/cudnn_frontend.h" ] && exit 0
py=/usr/bin/python3
[ -x $py ] || py=python3
echo "fetch-cudnn-frontend: cuDNN frontend $version headers into $dir"
mkdir -p "$dir"
$py - "$dir" "$wheel" "$sha256" "${PYPI_SIMPLE:-https://pypi.org/simple}" <<'PY'
import hashlib, io, os, re, shutil, sys, urllib.parse, urllib.request, zipfile
dest, wheel, sha, index = sys.argv[1:5]
try:
    page = urllib.request.urlopen(f"{index}/nvidia-cudnn-frontend/", timeout=120).read().decode()
    m = re.search(r'href="([^"#]*/' + re.escape(wheel) + r')(#[^"]*)?"', page)
    if not m:
        sys.exit(f"fetch-cudnn-frontend: {wheel} is not on {index}")
    url = urllib.parse.urljoin(f"{index}/nvidia-cudnn-frontend/", m.group(1))
    data = urllib.request.urlopen(url, timeout=300).read()
except (OSError, ValueError) as e:
    sys.exit(f"fetch-cudnn-frontend: download failed: {e}")
got = hashlib.sha256(data).hexdigest()
if got != sha:
    sys.exit(f"fetch-cudnn-frontend: {wheel}: sha256 {got}, expected {sha}")
tmp = dest + "/.include.tmp"
shutil.rmtree(tmp, ignore_errors=True)
with zipfile.ZipFile(io.BytesIO(data)) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    lic = [n for n in z.namelist() if not n.startswith("include/") and
           (n.endswith("/LICENSE") or n.endswith("/LICENSE.txt"))]
    for n in names + lic[:1]:
        out = os.path.join(tmp, n[len("include/"):] if n.startswith("include/") else "LICENSE")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(n) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
if lic:
    os.replace(os.path.join(tmp, "LICENSE"), os.path.join(dest, "LICENSE"))
shutil.rmtree(dest + "/include", ignore_errors=True)
os.replace(tmp, dest + "/include")
print(f"fetch-cudnn-frontend: {len(names)} headers")
PY
