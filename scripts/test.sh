#!/usr/bin/env bash
# One command: install packages, build (CUDA code too when nvcc exists), run every CPU and MPI
# test, and the GPU tests when a GPU is present (they skip themselves otherwise).
#   scripts/test.sh            build dir: build/ (BUILD_DIR overrides)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"

bash scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs"

# OpenMPI refuses root without these; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Busy-waiting OpenMP threads starve each other on small machines.
export OMP_WAIT_POLICY=passive
labels="cpu"
[ -d tests/mpi ] && labels="$labels|mpi"
if nvidia-smi -L >/dev/null 2>&1; then labels="$labels|gpu"; fi
ctest --test-dir "$build" -L "$labels" --output-on-failure -j 2 --timeout 900
