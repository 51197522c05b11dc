#!/usr/bin/env bash
# install-deps.sh — install every Debian/Ubuntu package that Tessera's build, tests and
# demo need, then the project's Python environment: .venv at the top of the source tree,
# made from /usr/bin/python3 with its packages visible (--system-site-packages), holding
# the PyPI packages of tools/requirements.txt: tokenizers and pyarrow, which tools/tsr-prepare
# needs for Hugging Face tokenizers and Parquet inputs, and tensorboard, for tools/tsr-plot
# --tensorboard.  Idempotent: when everything is present it only checks (about a second).
# A venv that cannot be made (no PyPI) is a warning, not a failure: only those features
# need it.
set -euo pipefail

PKGS=(
  build-essential autoconf automake libtool pkg-config   # the autotools build
  libopenmpi-dev openmpi-bin                              # MPI (mpicc, mpirun)
  libhdf5-openmpi-dev hdf5-tools                          # parallel HDF5 checkpoints, h5dump
  libopenblas-dev                                         # CPU GEMMs
  fortunes fortune-mod                                    # the demo corpus
  sentencepiece                                           # BPE tokenizer (spm_train, spm_encode)
  libsentencepiece-dev                                    # its library: tessera generate on spm shards
  python3 python3-numpy python3-h5py python3-torch        # independent reference tests
  python3-venv python3-zstandard                          # tsr-prepare: its .venv, .zst inputs
  python3-matplotlib                                      # tools/tsr-plot (metrics.jsonl -> PNG)
  clang libclang-rt-dev                                   # libFuzzer for the deck fuzz test
  shellcheck                                              # lint of the Slurm job scripts
  slurm-wlm munge libpmix-dev procps                      # tests/e2e/slurm.sh: its own slurmctld + 2 slurmd, srun --mpi=pmix
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
else
  SUDO=
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-deps: done"
fi

# The venv: checked by importing the pinned versions; made or completed only when that fails.
top=$(cd "$(dirname "$0")/.." && pwd)
venv=$top/.venv
req=$top/tools/requirements.txt
venv_ok() {
  "$venv/bin/python" - "$req" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        __import__(name)
        assert version(name) == want, (name, version(name), want)
PY
}
if venv_ok; then
  echo "install-deps: $venv has $(grep -c '==' "$req") PyPI packages of tools/requirements.txt"
  exit 0
fi
echo "install-deps: making $venv (tools/requirements.txt from PyPI)"
if { [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"; } &&
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --retries 1 --timeout 30 \
    -r "$req" && venv_ok; then
  echo "install-deps: $venv ready"
else
  echo "install-deps: warning: could not set up $venv; tools/tsr-prepare --tokenizer hf and" \
    "Parquet inputs, and tools/tsr-plot --tensorboard, need it (rerun tools/install-deps.sh" \
    "where PyPI can be reached)" >&2
fi
