#!/usr/bin/env bash
# install-deps.sh — install every Debian/Ubuntu package that Tessera's build, tests and
# demo need.  Idempotent: when everything is present it only checks (about a second).
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
  exit 0
fi
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
