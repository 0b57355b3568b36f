#!/usr/bin/env bash
# Open MPI for the multi-node tests: install Debian's openmpi-bin when `mpirun` is missing and
# print the path of mpirun (its version goes to stderr). Nothing to start: mpirun launches the
# processes itself.
#   EMBER_TEST_MPIRUN="$(scripts/mpi.sh)"
# Fails loudly (exit 1) when it cannot be installed: never a silent skip.
set -euo pipefail
die() { echo "scripts/mpi.sh: ERROR: $*" >&2; exit 1; }
if ! command -v mpirun >/dev/null; then
    echo "scripts/mpi.sh: installing openmpi-bin from Debian's packages" >&2
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin >/dev/null) \
        || die "apt-get install openmpi-bin failed"
    command -v mpirun >/dev/null || die "openmpi-bin installed but mpirun is not on PATH"
fi
version=$(mpirun --version 2>/dev/null | head -1) || die "mpirun is installed but does not run"
echo "scripts/mpi.sh: $version" >&2
command -v mpirun
