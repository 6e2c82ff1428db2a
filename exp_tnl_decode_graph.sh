# XXX experiment, not for main until measured: TransNormerLLM decoding replayed from a CUDA graph
# (LRPE at positions read on the device, lrpe_fwd_at). One device call: the GPU tests that cover
# it, then decoding with and without the graph. Run: bash exp_tnl_decode_graph.sh
set -uo pipefail
export OUT=${OUT:-/tmp/out}
GPU_CHECK_TARGETS="linac linac_gpu_tests" scripts/gpu_check.sh none 2>&1 | grep -E "build rc|error" | head
NCCL_ROOT=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])'); export LD_LIBRARY_PATH=$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}
timeout 150 ./build-gpu/linac_gpu_tests --gtest_brief=1 --gtest_filter='Lrpe*:Lightning*:*Decode*:*Generate*:*Transnormer*:ModelGpu.*' > $OUT/tests.log 2>&1
grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|actual|trace:" $OUT/tests.log | head -30
for g in "" --no-graph; do
  echo "transnormer_385m ${g:-graph}"
  timeout 90 ./build-gpu/linac bench --generate configs/transnormer_385m.json --batch 1,16,128 --prompt-len 512 --gen-len 256 $g 2>&1 | grep -E "^ +[0-9]+ +512"
done
