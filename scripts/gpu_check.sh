#!/usr/bin/env bash
# One scripted GPU session: build (sm_90), then the modes asked for; logs go to $OUT (or
# ./gpu_check_out) and a summary of the test runs is printed last.
#   scripts/gpu_check.sh [MODE]   (default: all; an unknown MODE, e.g. none, only builds)
# The modes live in scripts/gpu_check/, each file opening with what its modes run:
#   suite.sh      tests bench perf based tnl latte vq generate (all = these, in this order)
#   profiles.sh   gemms gla taylor latteprof xentprof swiglubwd ropeprof attnprof memprof power gemmtune
#   multi_gpu.sh  zero1 zero4 nettransport zero4mem trace4 ckpt13b
#   peers.sh      decode peers table logits residual fla
#   features.sh   compare sanitize docs gqa
# GPU_CHECK_TARGETS limits the build to those ninja targets (e.g. "linac linac_gpu_tests");
# GPU_CHECK_JOBS sets ninja's parallelism (default 16; the 4-GPU hosts have 64 cores).
set -uo pipefail
what="${1:-all}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/gpu_check_out}"
mkdir -p "$out"
cd "$root"
export NCCL_NVLS_ENABLE=0
if [ -z "${NCCL_ROOT:-}" ]; then
  NCCL_ROOT=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])' 2>/dev/null || true)
fi
[ -n "$NCCL_ROOT" ] && export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$out/gpu.txt"

t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${NCCL_ROOT:+-DNCCL_ROOT=$NCCL_ROOT} >"$out/build.log" 2>&1 &&
  ninja -C build-gpu -j"${GPU_CHECK_JOBS:-16}" ${GPU_CHECK_TARGETS:-} >>"$out/build.log" 2>&1
build_rc=$?
echo "build rc=$build_rc in $(( $(date +%s) - t0 )) s"
if [ $build_rc -ne 0 ]; then grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; fi

summary=()
# gpu_tests LABEL LOG [GTEST_FILTER]: the GPU tests (all, or a filter) into $out/LOG, their result
# line in the summary, the failures with their context (SCOPED_TRACE lines name the failing case).
# GPU_TESTS_SHARD=I/N runs gtest's shard I of N (0-based), so that a suite longer than one device
# call can run over several; each test's time goes to $out/LOG.json (gtest's JSON report).
gpu_tests() {
  local t0 rc shard=()
  t0=$(date +%s)
  if [ -n "${GPU_TESTS_SHARD:-}" ]; then
    shard=(env GTEST_SHARD_INDEX="${GPU_TESTS_SHARD%/*}" GTEST_TOTAL_SHARDS="${GPU_TESTS_SHARD#*/}")
  fi
  LINAC_BIN="$root/build-gpu/linac" "${shard[@]}" ./build-gpu/linac_gpu_tests --gtest_brief=1 \
    --gtest_output="json:$out/$2.json" ${3:+--gtest_filter="$3"} >"$out/$2" 2>&1
  rc=$?
  summary+=("$1${GPU_TESTS_SHARD:+ (shard $GPU_TESTS_SHARD)} rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/$2" | tr '\n' ' ')")
  grep -E -A1 '^\[  FAILED|Failure|error:|Expected|Which is|actual|Google Test trace' "$out/$2" | head -80
}

for part in suite profiles multi_gpu peers features; do
  source "$root/scripts/gpu_check/$part.sh"
done
printf '%s\n' "${summary[@]}"
