#!/usr/bin/env bash
# hvdtrain on a cluster where you are not root: the site's MPI and compilers from its modules, your own virtualenv.
#
#   bash examples/cluster/install-nonroot.sh                                  # module load openmpi, set up .venv
#   HVDTRAIN_MODULES="gcc/12 openmpi/4.1 cuda/12.4" bash examples/cluster/install-nonroot.sh
#   HVDTRAIN_MODULES= bash examples/cluster/install-nonroot.sh                # an MPI already on PATH, no modules
#
# Run it in the checkout, on a node like those that will train: on a GPU node (an interactive job such as
# `srun --gpus=1 --pty bash`) Horovod is built with NCCL for its GPUs; on a login node without GPUs, for CPU.
# 1. loads HVDTRAIN_MODULES (default: openmpi) with the site's `module` command (Lmod or Environment Modules);
# 2. checks that an MPI compiler wrapper (mpicxx), mpirun and a C++ compiler are on PATH: Horovod is compiled
#    against the MPI the jobs will run with; nothing is installed outside your home and the checkout;
# 3. creates the virtualenv (VENV, default .venv; PYTHON picks the interpreter) and puts PyPI's CMake in it when
#    the site has no cmake;
# 4. runs scripts/setup-env: torch, hvdtrain, and Horovod compiled once (docs/install.md#how-long-the-horovod-build-takes) and cached in
#    ~/.cache/hvdtrain (HVDTRAIN_CACHE moves it); it never calls apt without root.
# The jobs need the same modules: load them before sbatch (sbatch passes your environment on), then e.g.
# `sbatch examples/cluster/own_script.sbatch train.py`. DRY_RUN=1 prints what would be installed, changing nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

fail() {
    echo "install-nonroot: error: $1" >&2
    exit 2
}

modules="${HVDTRAIN_MODULES-openmpi}"
if [ -n "$modules" ]; then
    if ! type module >/dev/null 2>&1; then   # a batch shell may not have the login shell's function
        for init in "${MODULESHOME:-/usr/share/modules}/init/bash" /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do
            if [ -f "$init" ]; then
                # shellcheck disable=SC1090  # the site's own file
                source "$init"
                break
            fi
        done
    fi
    type module >/dev/null 2>&1 \
        || fail "no 'module' command here; set HVDTRAIN_MODULES='' and put your MPI's bin folder on PATH instead"
    # shellcheck disable=SC2086  # one word per module
    module load $modules || fail "'module load $modules' failed; see 'module avail' for the names at this site"
fi

missing=()
for tool in mpicxx mpirun g++; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] || fail "no ${missing[*]} on PATH; load the site's MPI and compiler modules (HVDTRAIN_MODULES)"
echo "install-nonroot: MPI $(command -v mpicxx), $(mpirun --version 2>&1 | head -n 1)"

python="${PYTHON:-python3}"
venv="${VENV:-.venv}"
run=()
[ -z "${DRY_RUN:-}" ] || run=(echo "+")
if ! command -v cmake >/dev/null; then
    [ -x "$venv/bin/python" ] || ${run[@]+"${run[@]}"} "$python" -m venv "$venv"
    ${run[@]+"${run[@]}"} "$venv/bin/python" -m pip --disable-pip-version-check -q install cmake
    PATH="$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")/bin:$PATH"   # Horovod's build finds it there
    export PATH
fi
PYTHON="$python" VENV="$venv" exec bash scripts/setup-env
