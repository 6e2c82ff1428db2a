#!/usr/bin/env bash
# 4-GPU session: build, ZeRO-2 memory of the 1.3B models against no ZeRO, 2-GPU tests, all GPU tests.
set -u
export GPU_CHECK_JOBS=48 NCCL_NVLS_ENABLE=0
NCCL_ROOT=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')
export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
CONFIGS=transformer_1.3b ZERO="0 2" timeout 330 scripts/gpu_check.sh zero4mem > $OUT/mem1.log 2>&1; el "mem1 rc=$?"
LINAC_BIN=$PWD/build-gpu/linac timeout 200 ./build-gpu/linac_gpu_tests --gtest_brief=1 --gtest_filter='ZeroGpu.*:DistGpu.*' > $OUT/zero_tests.log 2>&1; el "2-GPU tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/zero_tests.log | tr '\n' ' ')"
grep -E -A2 'Failure|Expected' $OUT/zero_tests.log | head -20
rem=$(( 560 - ($(date +%s) - t0) )); [ $rem -gt 120 ] && { CONFIGS=gla_1.3b ZERO="0 2" timeout $((rem - 100)) scripts/gpu_check.sh zero4mem > $OUT/mem2.log 2>&1; el "mem2 rc=$?"; }
rem=$(( 570 - ($(date +%s) - t0) )); [ $rem -gt 60 ] && { LINAC_BIN=$PWD/build-gpu/linac timeout $rem ./build-gpu/linac_gpu_tests --gtest_brief=1 > $OUT/gpu_tests.log 2>&1; el "all gpu tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/gpu_tests.log | tr '\n' ' ')"; grep -E -A2 'Failure|Expected' $OUT/gpu_tests.log | head -20; }
grep -E "zero=|GiB|tokens/s|T  " $OUT/zero4.txt 2>/dev/null | head -60
