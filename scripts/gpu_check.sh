#!/usr/bin/env bash
# One scripted GPU session: build (sm_90), GPU + CPU-model tests, benchmarks. Logs go to
# $OUT (or ./gpu_check_out), a summary table is printed last.
#   scripts/gpu_check.sh [tests|bench|perf|gemms|gemmtune|gla|taylor|based|tnl|latte|latteprof|vq|table|generate|zero1|zero4|zero4mem|trace4|nettransport|compare|sanitize|docs|gqa|decode|peers|logits|ckpt13b|all]
#   (default: all; perf: attention kernels and the 125M step next to PyTorch, issue 15; an
#   architecture: only its benchmarks; generate: decode tests, the hf export check,
#   decode benchmarks; zero1 (1 GPU), zero4 and zero4mem (4 GPUs), not part of all: recompute, ZeRO-1
#   and overlap, issue 16; trace4 (4 GPUs, not part of all): every rank's kernel timeline of the 125M
#   and GLA 340M steps, overlapped (scripts/kernel_trace.cpp/.py; $OUT/traces.tgz holds the CSVs);
#   nettransport (2 or 4 GPUs, not part of all): data-parallel scaling over NCCL's network transport,
#   gradients reduced in f32 and in bf16, issue 48;
#   compare, not part of all: scripts/compare.sh, issue 17; gemms, not part of
#   all: the GEMMs of the 125M and GLA 340M steps by problem, and Nsight Compute's view of them;
#   gemmtune, not part of all: GEMM algorithm tables (docs/gemm_tuning.md) tuned per model and the
#   step with and without them, alternating;
#   gla, not part of all: the GLA op and the 340M step, and Nsight Compute's per-kernel table of
#   one 340M layer (kernels/gla/NOTES.md); taylor, not part of all: the Taylor op and Nsight
#   Compute's view of its kernels at T = 8192, warp states and instruction counts included, and
#   their SASS loops (scripts/sass_mix.py; kernels/taylor_attn/NOTES.md); latteprof, not part of all:
#   the Latte core's backward kernels and the window attention's backward under Nsight Compute, where
#   their warps wait (scripts/ncu_stalls.py; kernels/latte/NOTES.md, kernels/attention/NOTES.md); table,
#   not part of all: every architecture's step and the 125M model's PyTorch peers, issue 49;
#   sanitize, not part of all: compute-sanitizer memcheck and racecheck over the parity tests;
#   docs, not part of all: document packing's tests, benchmarks and Brown runs, issue 47;
#   gqa, not part of all: the GPU suite, linac import against transformers, grouped-query
#   attention next to SDPA and GQA decoding against multi-head, issue 50; decode and peers, not
#   part of all: the decode tests and decoding with and without CUDA graphs (DECODE_EAGER=0: only
#   with; DECODE_TRACE=0: no kernel timelines), and the 125M step and
#   its decoding next to the strongest PyTorch and HF peers, issue 49; logits, not part of all:
#   f32 against bf16 logits trained on Brown (scripts/logits_dtype_brown.sh), issue 49; ckpt13b, not part of
#   all (4 GPUs): sharded asynchronous checkpoints of the 1.3B model and the data-parallel GPU
#   tests, issue 48)
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
gpu_tests() {
  local t0 rc
  t0=$(date +%s)
  LINAC_BIN="$root/build-gpu/linac" ./build-gpu/linac_gpu_tests --gtest_brief=1 ${3:+--gtest_filter="$3"} \
    >"$out/$2" 2>&1
  rc=$?
  summary+=("$1 rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/$2" | tr '\n' ' ')")
  grep -E -A1 '^\[  FAILED|Failure|error:|Expected|Which is|actual|Google Test trace' "$out/$2" | head -80
}
if [ "$what" = all ] || [ "$what" = tests ]; then
  gpu_tests "gpu tests" gpu_tests.log
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  ./build-gpu/linac bench --op attention --seq-lens 2048,8192,32768 --tokens 32768 --heads 16 --head-dim 64 \
    2>&1 | tee -a "$out/bench.txt"
  ./build-gpu/linac bench configs/transformer_125m.json --seq-lens 2048 --micro-tokens 32768 \
    --tokens-per-step 32768 --steps 10 2>&1 | tee -a "$out/bench.txt"
fi
if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = perf ]; then
  # Issue 15: the attention op through both kernel families (LINAC_ATTENTION_KERNELS) next to
  # PyTorch SDPA / FlexAttention, the 125M model with its per-phase profile next to PyTorch eager
  # and torch.compile, GLA 340M; the PyTorch peers run here, in the same call.
  for fam in auto sm80; do
    for shape in "--head-dim 64" "--head-dim 64 --window 64" "--head-dim 128"; do
      LINAC_ATTENTION_KERNELS=$fam ./build-gpu/linac bench --op attention --seq-lens 2048,8192,32768 --tokens 32768 \
        --heads 16 $shape 2>&1 | tee -a "$out/perf.txt"
    done
  done
  for shape in "--head-dim 64" "--head-dim 64 --window 64" "--head-dim 128"; do
    timeout 120 python3 scripts/bench_torch.py --attention --heads 16 $shape 2>&1 | tail -5 | tee -a "$out/perf.txt"
  done
  ./build-gpu/linac bench configs/transformer_125m.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
    --steps 10 --profile 2>&1 | tee -a "$out/perf.txt"
  timeout 300 python3 scripts/bench_torch.py --model 2>&1 | tail -2 | tee -a "$out/perf.txt"
  ./build-gpu/linac bench configs/gla_340m.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
    --steps 10 --profile 2>&1 | tee -a "$out/perf.txt"
  ./build-gpu/linac bench --op gla --seq-lens 2048,8192,32768 --tokens 32768 --heads 4 --dk 128 --dv 256 \
    2>&1 | tee -a "$out/perf.txt"
fi
if [ "$what" = gemms ]; then
  # Where the GEMM time of a step goes: --profile's problem table (each GEMM shape's ms and
  # TFLOP/s) for both models, then Nsight Compute's throughputs (SM, L2, DRAM), grid and cluster
  # size of every GEMM kernel of one step of a 2-layer 125M model (cuBLASLt's and ours).
  for c in transformer_125m gla_340m; do
    ./build-gpu/linac bench configs/$c.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
      --steps 10 --profile 2>&1 | tee -a "$out/gemms.txt"
  done
  ncu --clock-control none -k 'regex:gemm|xmma|nvjet|swiglu_linear|cutlass|splitK|reduce' --launch-skip 0 --launch-count 60 \
    --section SpeedOfLight --section LaunchStats --section MemoryWorkloadAnalysis --csv --page details \
    ./build-gpu/linac bench configs/transformer_125m.json --set model.n_layers=2 --seq-lens 2048 \
    --micro-tokens 32768 --tokens-per-step 32768 --steps 1 --warmup 1 >"$out/ncu_gemms.csv" 2>"$out/ncu_gemms.err"
  python3 scripts/ncu_summary.py "$out/ncu_gemms.csv" 2>&1 | tee -a "$out/gemms.txt"
fi
if [ "$what" = gla ]; then
  # The GLA core at the 340M model's head shape, the 340M step, then one layer's kernels (the
  # second layer of a 2-layer step: its forward and the backward that reads the saved buffers).
  ./build-gpu/linac bench --op gla --seq-lens 2048,8192,32768 --tokens 32768 --heads 4 --dk 128 --dv 256 \
    2>&1 | tee -a "$out/gla.txt"
  ./build-gpu/linac bench configs/gla_340m.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
    --steps 10 2>&1 | tee -a "$out/gla.txt"
  ncu --clock-control none -k 'regex:dqk_kernel|out_kernel|intra_kernel|prep_kernel|state_' --launch-skip 4 \
    --launch-count 7 --section SpeedOfLight --section Occupancy --section LaunchStats --csv --page details \
    ./build-gpu/linac bench configs/gla_340m.json --set model.n_layers=2 --seq-lens 2048 \
    --micro-tokens 32768 --tokens-per-step 32768 --steps 1 --warmup 1 >"$out/ncu_gla.csv" 2>"$out/ncu_gla.err"
  python3 scripts/ncu_summary.py "$out/ncu_gla.csv" 2>&1 | tee -a "$out/gla.txt"
fi
if [ "$what" = taylor ]; then
  # The Taylor op (issue 49): the bench at three lengths, then the kernels of one forward and one
  # backward at T = 8192 (segment totals, carries, the fused passes, the g~ prep) under Nsight
  # Compute with their warp states (kernels/taylor_attn/NOTES.md: what holds the segment totals;
  # $OUT/ncu_taylor.csv keeps every metric).
  ./build-gpu/linac bench --op taylor --seq-lens 2048,8192,32768 --tokens 32768 --heads 16 --head-dim 64 \
    2>&1 | tee -a "$out/taylor.txt"
  ncu --clock-control none -k 'regex:totals_kernel|carry_kernel|fused_kernel|prep_kernel' --launch-skip 9 \
    --launch-count 8 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --csv --page details \
    ./build-gpu/linac bench --op taylor --seq-lens 8192 --tokens 32768 --heads 16 --head-dim 64 --iters 1 \
    >"$out/ncu_taylor.csv" 2>"$out/ncu_taylor.err"
  python3 scripts/ncu_summary.py "$out/ncu_taylor.csv" 2>&1 | tee -a "$out/taylor.txt"
  # Their SASS: each kernel's loops and what they issue ($OUT/taylor.sass keeps the listing).
  for o in linac_kernels.dir/kernels/taylor_attn/taylor_attn_totals.cu.o \
    linac_kernels_sm90a.dir/kernels/taylor_attn/taylor_attn_fused_sm90.cu.o; do
    "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" -sass "build-gpu/CMakeFiles/$o"
  done >"$out/taylor.sass" 2>&1
  python3 scripts/sass_mix.py --kernel 'totals_kernel|fused_kernel' "$out/taylor.sass" 2>&1 | tee -a "$out/taylor.txt"
fi
if [ "$what" = latteprof ]; then
  # What limits Latte-Macchiato 153M's non-GEMM kernels (issue 49): the Latte core's two backward
  # kernels and the window attention's backward (8 heads of 96, window 129) at the model's shape
  # under Nsight Compute, their durations and rates (scripts/ncu_summary.py) and where their warps
  # wait (scripts/ncu_stalls.py: stall reasons, mbarrier waits, the busiest instructions).
  secs="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
    --section SourceCounters --section SchedulerStats --section InstructionStats"
  prof() {  # prof NAME KERNEL_REGEX BENCH_ARGS...: one launch of the backward's kernel
    local name=$1 kernel=$2
    shift 2
    ncu --clock-control none -k "regex:$kernel" --launch-count 1 $secs -o "$out/$name" \
      ./build-gpu/linac bench "$@" --seq-lens 2048 --tokens 32768 --iters 1 >"$out/$name.err" 2>&1
    ncu -i "$out/$name.ncu-rep" --csv --page details >"$out/$name.csv" 2>&1
    ncu -i "$out/$name.ncu-rep" --csv --page source --print-source sass >"$out/${name}_source.csv" 2>&1
    { python3 scripts/ncu_summary.py "$out/$name.csv"; python3 scripts/ncu_stalls.py "$out/${name}_source.csv"; } 2>&1 |
      tee -a "$out/latteprof.txt"
    rm -f "$out/$name.ncu-rep" "$out/$name.csv" "$out/${name}_source.csv"
  }
  latte=(--op latte --heads 8 --head-dim 96 --latents 16 --macchiato)
  prof latte_grad_p grad_p_kernel "${latte[@]}"
  prof latte_grad_bv grad_bv_kernel "${latte[@]}"
  prof window_bwd bwd_sm90_kernel --op attention --heads 8 --head-dim 96 --window 129
fi
if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = based ]; then
  # Based (issue 10): the Taylor op next to GLA and attention, sliding windows, the 360M model
  # next to Transformer++ of the same size.
  ./build-gpu/linac bench --op taylor --seq-lens 2048,8192,32768 --tokens 32768 --heads 16 --head-dim 64 \
    2>&1 | tee -a "$out/bench.txt"
  ./build-gpu/linac bench --op gla --seq-lens 2048,8192,32768 --tokens 32768 --heads 4 --dk 128 --dv 256 \
    2>&1 | tee -a "$out/bench.txt"
  for w in 16 64; do
    ./build-gpu/linac bench --op attention --seq-lens 2048,8192,32768 --tokens 32768 --heads 16 --head-dim 64 \
      --window $w 2>&1 | tee -a "$out/bench.txt"
  done
  for c in based_360m transformer_360m; do
    ./build-gpu/linac bench configs/$c.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
      --steps 10 2>&1 | tee -a "$out/bench.txt"
  done
fi
if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = tnl ]; then
  # TransNormerLLM (issue 11): the lightning op at the issue's shape, the lightning-attention README's b=4 h=32 d=128
  # sweep (one sequence length per call: 4 sequences of n tokens), the 385M model.
  ./build-gpu/linac bench --op lightning --seq-lens 2048,8192,32768 --tokens 32768 --heads 16 --head-dim 64 \
    2>&1 | tee -a "$out/bench.txt"
  for n in 2048 4096 8192 16384 32768; do
    LINAC_WORKSPACE_MB=9000 ./build-gpu/linac bench --op lightning --seq-lens $n --tokens $((4 * n)) --heads 32 \
      --head-dim 128 2>&1 | tee -a "$out/bench.txt"
  done
  ./build-gpu/linac bench configs/transnormer_385m.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
    --steps 10 2>&1 | tee -a "$out/bench.txt"
fi
if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = latte ]; then
  # Latte (issue 12): the op at the paper's head (8 x 96, 16 latents) and at 4 heads with 128
  # latents in all, next to GLA with the same state size (Dk = latents per head) and attention at
  # the same T; Latte-Macchiato 153M against a Transformer++ of its width, depth and vocabulary
  # at T = 2048 and 8192.
  for shape in "--heads 8 --head-dim 96 --latents 16" "--heads 4 --head-dim 128 --latents 32" \
               "--heads 8 --head-dim 96 --latents 16 --macchiato"; do
    ./build-gpu/linac bench --op latte --seq-lens 2048,8192,32768 --tokens 32768 $shape 2>&1 | tee -a "$out/bench.txt"
  done
  for shape in "--heads 8 --dk 16 --dv 96" "--heads 4 --dk 32 --dv 128"; do
    ./build-gpu/linac bench --op gla --seq-lens 2048,8192,32768 --tokens 32768 $shape 2>&1 | tee -a "$out/bench.txt"
  done
  ./build-gpu/linac bench --op attention --seq-lens 2048,8192,32768 --tokens 32768 --heads 8 --head-dim 96 \
    2>&1 | tee -a "$out/bench.txt"
  for T in 2048 8192; do
    for c in "configs/latte_macchiato_153m.json" \
             "configs/transformer_125m.json --set model.vocab_size=50264 --set model.tie_embeddings=true --set model.ffn_hidden=3072"; do
      ./build-gpu/linac bench $c --seq-lens $T --micro-tokens 32768 --tokens-per-step 32768 --steps 10 \
        2>&1 | tee -a "$out/bench.txt"
    done
  done
fi
if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = vq ]; then
  # Transformer-VQ (issue 13): the op at the SHGA head (Dk 128, Dv 1536, S 512, Lb 512) and 12 x 64
  # next to attention; the 190M model against a Transformer++ of the same size (docs/transformer_vq.md §6
  # comparison: 24 layers of attention + MLP at D 768, FFN 2304: 184.4M parameters against 184.5M)
  # with its vocabulary at T = 2048, 8192 and 32768.
  ./build-gpu/linac bench --op vq_attn --seq-lens 2048,8192,32768 --tokens 32768 2>&1 | tee -a "$out/bench.txt"
  ./build-gpu/linac bench --op vq_attn --seq-lens 2048,8192,32768 --tokens 32768 --heads 12 --dk 64 --dv 64 \
    2>&1 | tee -a "$out/bench.txt"
  ./build-gpu/linac bench --op attention --seq-lens 2048,8192,32768 --tokens 32768 --heads 12 --head-dim 64 \
    2>&1 | tee -a "$out/bench.txt"
  for T in 2048 8192 32768; do
    for c in "configs/transformer_vq_190m.json" \
             "configs/transformer_125m.json --set model.vocab_size=256 --set model.n_layers=24 --set model.ffn_hidden=2304"; do
      ./build-gpu/linac bench $c --seq-lens $T --micro-tokens 32768 --tokens-per-step 32768 --steps 2 --warmup 1 \
        2>&1 | tee -a "$out/bench.txt"
    done
  done
fi
if [ "$what" = all ] || [ "$what" = generate ]; then
  # Generation (issue 14): GPU decode tests; a tiny transformer trained here (synthetic text),
  # exported to Hugging Face and checked against linac (tied and untied); decode benchmarks of
  # Transformer++ 125M and GLA 340M next to HF generate (eager) at the same shapes; GLA decode
  # speed at positions ~100 and ~4000.
  t0=$(date +%s)
  LINAC_BIN="$root/build-gpu/linac" ./build-gpu/linac_gpu_tests --gtest_brief=1 \
    --gtest_filter='GenerateGpu*:AttentionDecode*:*ModelGpu*Decode*' >"$out/generate_tests.log" 2>&1
  rc=$?
  summary+=("generate gpu tests rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/generate_tests.log" | tr '\n' ' ')")
  grep -E -A1 '^\[  FAILED|Failure|Expected|Which is|Google Test trace' "$out/generate_tests.log" | head -40
  gen="$(mktemp -d /tmp/linac_gen.XXXXXX)"  # data, runs and exports: not results, kept out of $out
  mkdir -p "$gen/text"
  python3 - "$gen/text/corpus.txt" <<'PY'
import random, sys
random.seed(7)
nouns = "city river king army church school market road village house ship forest mountain council trade war".split()
verbs = "built crossed ruled defended founded opened followed reached governed entered sold remembered".split()
adjs = "old new great small northern ancient quiet busy royal famous".split()
with open(sys.argv[1], "w") as f:
    for d in range(3000):
        for s in range(6):
            f.write(f"The {random.choice(adjs)} {random.choice(nouns)} {random.choice(verbs)} the "
                    f"{random.choice(adjs)} {random.choice(nouns)} in {1000 + random.randrange(900)}. ")
        f.write("\n\n")
PY
  ./build-gpu/linac prepare --input "$gen/text" --out "$gen/tiny.h5" --vocab-size 512 >"$gen/prepare.log" 2>&1
  for tie in false true; do
    ./build-gpu/linac train configs/quickstart.json --set data.path="$gen/tiny.h5" --set model.vocab_size=512 \
      --set model.tie_embeddings=$tie --set train.steps=100 --set train.checkpoint_every=100 \
      --set train.out_dir="$gen/run_$tie" >"$gen/train_$tie.log" 2>&1
    ckpt="$gen/run_$tie/ckpt/$(cat "$gen/run_$tie/ckpt/latest")"
    ./build-gpu/linac export --checkpoint "$ckpt" --out "$gen/hf_$tie" --format hf
    python3 scripts/check_hf_export.py --linac ./build-gpu/linac --checkpoint "$ckpt" --export "$gen/hf_$tie" \
      2>"$gen/check_hf_$tie.err" | tee -a "$out/generate.txt"
    rc=${PIPESTATUS[0]}
    summary+=("hf export check (tied=$tie) rc=$rc")
    [ $rc -ne 0 ] && tail -5 "$gen/train_$tie.log" "$gen/check_hf_$tie.err" | tee -a "$out/generate.txt"
    ./build-gpu/linac generate --checkpoint "$ckpt" --prompt "The old city" --max-new-tokens 40 --temperature 0.8 \
      --top-k 40 --seed 1 2>&1 | tee -a "$out/generate.txt"
  done
  python3 scripts/check_hf_import.py --linac ./build-gpu/linac --workdir "$gen/hf_import" \
    2>"$gen/check_hf_import.err" | tee -a "$out/generate.txt"
  rc=${PIPESTATUS[0]}
  summary+=("hf import check rc=$rc")
  [ $rc -ne 0 ] && tail -5 "$gen/check_hf_import.err" | tee -a "$out/generate.txt"
  for c in transformer_125m gla_340m; do
    ./build-gpu/linac bench --generate configs/$c.json --batch 1,16,128 --prompt-len 512 --gen-len 1024 \
      2>&1 | tee -a "$out/generate.txt"
  done
  ./build-gpu/linac bench --generate configs/gla_340m.json --batch 16 --prompt-len 100,4000 --gen-len 64 \
    2>&1 | tee -a "$out/generate.txt"
  timeout 240 python3 scripts/bench_hf_generate.py --linac-config configs/transformer_125m.json --batch 1,16,128 \
    --prompt-len 512 --gen-len 1024 2>"$gen/bench_hf.err" | tee -a "$out/generate.txt"
  tail -3 "$gen/bench_hf.err" >>"$out/generate.txt"
fi
if [ "$what" = zero1 ]; then
  # Issue 16 on one GPU: recompute gives the same gradients bit for bit (bf16 and fp32); the 1.3B
  # models at T = 2048 with each recompute mode: tokens/s, MFU, peak memory; `linac info`'s plan.
  t0=$(date +%s)
  ./build-gpu/linac_gpu_tests --gtest_brief=1 --gtest_filter='RecomputeGpu.*' >"$out/zero1_tests.log" 2>&1
  rc=$?
  summary+=("recompute gpu tests rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/zero1_tests.log" | tr '\n' ' ')")
  grep -E -A1 '^\[  FAILED|Failure|Expected|Which is|Google Test trace' "$out/zero1_tests.log" | head -40
  for c in transformer_1.3b gla_1.3b; do
    for r in ${RECOMPUTE:-none block}; do  # RECOMPUTE="mixer" for the third mode (a 1.3B init takes a while)
      ./build-gpu/linac info configs/$c.json --set train.recompute=$r | grep -E 'activations|total' | sed "s|^|$c $r: |" \
        | tee -a "$out/zero1.txt"
      ./build-gpu/linac bench configs/$c.json --seq-lens 2048 --steps 5 --warmup 2 --set train.recompute=$r \
        2>&1 | tee -a "$out/zero1.txt"
    done
  done
fi
if [ "$what" = zero4 ]; then
  # Issue 16 on 4 GPUs (two commands, each within 10 minutes): zero4 runs the 2-GPU ZeRO-1 tests,
  # the scaling of the 125M/340M models with the reduction overlapped or not and ZeRO-1 off or
  # on, and rank 0's per-phase profile of the 125M step on 4 GPUs with overlap on and off (where
  # the overlapped step loses its time); zero4mem the 1.3B models' peak memory per GPU without ZeRO
  # and with ZeRO-1 and ZeRO-2 (block recompute, T = 2048) next to what `linac info --ranks 4`
  # planned. ZERO (zero4: "0 1", zero4mem: "0 1 2") and, for zero4mem, CONFIGS pick the runs.
  t0=$(date +%s)
  LINAC_BIN="$root/build-gpu/linac" ./build-gpu/linac_gpu_tests --gtest_brief=1 --gtest_filter='ZeroGpu.*:DistGpu.*' \
    >"$out/zero4_tests.log" 2>&1
  rc=$?
  summary+=("2-GPU ZeRO/DP tests rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/zero4_tests.log" | tr '\n' ' ')")
  grep -E -A1 '^\[  FAILED|Failure|Expected|Which is|Google Test trace' "$out/zero4_tests.log" | head -40
  OVERLAP="true false" ZERO="${ZERO:-0 1}" bash scripts/scaling.sh build-gpu "1 2 4" 2>&1 | tee -a "$out/zero4.txt"
  for ov in true false; do
    echo "4 GPUs, overlap_comm=$ov, rank 0:" | tee -a "$out/zero4.txt"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 4 --bind-to none -x NCCL_NVLS_ENABLE \
      -x LD_LIBRARY_PATH ./build-gpu/linac bench configs/transformer_125m.json --seq-lens 2048 --micro-tokens 32768 \
      --tokens-per-step 32768 --steps 10 --warmup 3 --profile --set train.overlap_comm=$ov 2>&1 | tee -a "$out/zero4.txt"
  done
fi
if [ "$what" = nettransport ]; then
  # Issue 48: data-parallel scaling on the GPUs present (2 or 4) over NCCL's network transport (P2P
  # and shared memory off, as between hosts): the 125M and GLA 340M models, T = 2048, 8 micro-batches
  # of 32768 tokens per rank per step (the 1-GPU baseline's too), reductions overlapped, in f32 and in
  # bf16 (train.reduce_dtype); then over NVLink (no variables) at 1 micro-batch per step, for
  # reference. 6 timed steps after 2 warm-up keep it within about 6 minutes on 4 GPUs. The bf16
  # reduction's correctness test is in the GPU suite (ReduceBf16Gpu.*, `tests`).
  t0=$(date +%s)
  MICRO_PER_RANK=8 OVERLAP=true ZERO=0 REDUCE="f32 bf16" STEPS=6 WARMUP=2 \
    NCCL_ENV="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" bash scripts/scaling.sh build-gpu "1 2 4" 2>&1 |
    tee "$out/nettransport.txt"
  # The socket transport with more threads and sockets per connection (what Ethernet clusters tune).
  MICRO_PER_RANK=8 OVERLAP=true ZERO=0 REDUCE="f32 bf16" STEPS=6 WARMUP=2 \
    NCCL_ENV="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" \
    bash scripts/scaling.sh build-gpu "1 2 4" 2>&1 | tee -a "$out/nettransport.txt"
  MICRO_PER_RANK=1 OVERLAP=true ZERO=0 REDUCE="f32 bf16" STEPS=6 WARMUP=2 bash scripts/scaling.sh build-gpu "1 2 4" 2>&1 |
    tee -a "$out/nettransport.txt"
  # Which transport NCCL took with P2P and SHM off.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH \
    -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_DEBUG=INFO -x NCCL_NVLS_ENABLE ./build-gpu/linac bench \
    configs/transformer_125m.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 65536 --steps 1 --warmup 0 \
    2>&1 | grep -E "NET/|via NET|Using network|transport" | sort | uniq -c | head -12 | tee -a "$out/nettransport.txt"
  rows=$(grep -c ' GiB$' "$out/nettransport.txt")
  failed=$(grep -c ' failed$' "$out/nettransport.txt")
  summary+=("nettransport ($(( $(date +%s) - t0 )) s): $rows rows, $failed runs failed")
fi
if [ "$what" = zero4mem ]; then
  for c in ${CONFIGS:-transformer_1.3b gla_1.3b}; do
    for z in ${ZERO:-0 1 2}; do
      ./build-gpu/linac info configs/$c.json --ranks 4 --set train.zero=$z --set train.recompute=block \
        | grep -E 'memory plan|parameters \(|gradients|optimizer|activations|total' | sed "s|^|$c zero=$z: |" \
        | tee -a "$out/zero4.txt"
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 4 --bind-to none -x NCCL_NVLS_ENABLE \
        -x LD_LIBRARY_PATH ./build-gpu/linac bench configs/$c.json --seq-lens 2048 --steps 5 --warmup 2 \
        --set train.zero=$z --set train.recompute=block 2>&1 | tee -a "$out/zero4.txt"
    done
  done
fi
if [ "$what" = trace4 ]; then
  # Needs the linac_kernel_trace target (built with CUDA's CUPTI). Rank 0's summary in full, the
  # other ranks' step times; the CSVs come back in one archive ($OUT returns few files).
  for c in transformer_125m gla_340m; do
    rm -rf "/tmp/trace_$c" && mkdir -p "/tmp/trace_$c"
    echo "== $c on 4 GPUs, overlapped, kernel timeline" | tee -a "$out/trace4.txt"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 CUDA_INJECTION64_PATH="$root/build-gpu/liblinac_kernel_trace.so" \
      KTRACE_DIR="/tmp/trace_$c" timeout 200 mpirun -np 4 --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
      -x CUDA_INJECTION64_PATH -x KTRACE_DIR ./build-gpu/linac bench configs/$c.json --seq-lens 2048 \
      --micro-tokens 32768 --tokens-per-step 32768 --steps 10 --warmup 3 2>&1 | tee -a "$out/trace4.txt"
    python3 scripts/kernel_trace.py "/tmp/trace_$c" --top 30 >"/tmp/trace_$c/summary.txt" 2>&1
    awk '/^== trace.r0/{p=1; print; next} /^== /{p=0; print; next} p || /^steps/' "/tmp/trace_$c/summary.txt" \
      | tee -a "$out/trace4.txt"
  done
  tar -czf "$out/traces.tgz" -C /tmp trace_transformer_125m trace_gla_340m
fi
if [ "$what" = compare ]; then
  # Issue 17: scripts/compare.sh on the GPU. ARCHS / MIXERS (comma lists; set and empty: skip that
  # part) pick the language-model and MQAR runs, STEPS_LM / STEPS_MQAR their budgets. The LM part
  # needs data/brown.h5 (carry it: the GPU machine has no network). The tables, plots and every
  # run's metrics/eval/info come back under $out.
  # COMPARE_SECONDS bounds the runs (default 480: a command has 10 minutes, the build comes first),
  # so the tables of the runs that finished always come back.
  timeout "${COMPARE_SECONDS:-480}" bash scripts/compare.sh --build build-gpu --out runs/compare \
    --steps-lm "${STEPS_LM:-200}" ${STEPS_MQAR:+--steps-mqar "$STEPS_MQAR"} ${ARCHS+--archs "$ARCHS"} \
    ${MIXERS+--mixers "$MIXERS"} 2>&1 | tee "$out/compare.log"
  rc=${PIPESTATUS[0]}
  summary+=("compare rc=$rc$([ "$rc" = 124 ] && echo ' (stopped at COMPARE_SECONDS)')")
  [ "$rc" = 124 ] && python3 scripts/compare_table.py runs/compare 2>&1 | tee -a "$out/compare.log"
  for f in compare.md compare.json lm_loss.png mqar.png; do [ -f "runs/compare/$f" ] && cp "runs/compare/$f" "$out/"; done
  tar czf "$out/compare_runs.tgz" --exclude='*.h5' --exclude=latest runs/compare 2>/dev/null
fi
if [ "$what" = sanitize ]; then
  # Issue 51: compute-sanitizer over the GPU parity tests, one process per suite (each bounded by
  # SANITIZE_SUITE_SECONDS, default 150; the whole mode by SANITIZE_SECONDS, default 540, after
  # which the remaining suites are listed as not run). memcheck (out-of-bounds and misaligned
  # accesses, leaks of device memory) over the op suites and the models' CPU parity; racecheck
  # (shared-memory hazards) over the kernels that stage tiles in shared memory, parity cases only.
  # Full reports: $out/sanitize_<tool>_<suite>.log.
  t_start=$(date +%s)
  run_sanitizer() {  # tool suite filter
    local tool=$1 suite=$2 filter=$3 log="$out/sanitize_$1_$2.log"
    if [ $(( $(date +%s) - t_start )) -gt "${SANITIZE_SECONDS:-540}" ]; then
      summary+=("$tool $suite: not run (SANITIZE_SECONDS spent)"); return
    fi
    local t0=$(date +%s)
    LINAC_GPU_SANITIZE=1 timeout "${SANITIZE_SUITE_SECONDS:-150}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      $([ "$tool" = memcheck ] && echo --leak-check full) \
      ./build-gpu/linac_gpu_tests --gtest_brief=1 --gtest_filter="$filter" >"$log" 2>&1
    local rc=$?
    local verdict
    verdict="$(grep -E '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tr '\n' ' ')"
    # Hazards reported inside cuBLASLt's own kernels (nvjet_*) are counted apart: excluding those
    # kernels (--kernel-name-exclude) made cuBLASLt fail under the sanitizer on an H200.
    if [ "$tool" = racecheck ]; then
      verdict+="($(grep 'Race reported' "$log" | grep -vc nvjet) in linac kernels, $(grep 'Race reported' "$log" | grep -c nvjet) in cuBLASLt's)"
    fi
    summary+=("$tool $suite rc=$rc ($(( $(date +%s) - t0 )) s): $verdict$([ $rc = 124 ] && echo '(timed out)')")
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -E -m 12 'Invalid|Race|Hazard|ERROR|FAILED|at 0x|by thread' "$log"
  }
  # MEMCHECK_SUITES / RACECHECK_SUITES (set, even empty) replace the lists; "Models" is the
  # models' CPU-parity tests.
  models='ModelGpu.MatchesCpuBf16/*:ModelGpu.MatchesCpuFp32/transformer_vq'
  for suite in ${MEMCHECK_SUITES-Reduce Adamw Silu Elementwise Embedding Rmsnorm Srmsnorm Swiglu SwigluLinear Rope \
               RopeLinear Lrpe CrossEntropy Matmul ShortConv LogGate NormGate Attention AttentionDecode Gla Latte \
               Lightning TaylorAttn VqAttn VqQuant Models}; do
    run_sanitizer memcheck "$suite" "$([ "$suite" = Models ] && echo "$models" || echo "${suite}Gpu.*")"
  done
  for suite in ${RACECHECK_SUITES-Attention Gla Latte Lightning TaylorAttn VqAttn CrossEntropy Rmsnorm Reduce ShortConv}; do
    run_sanitizer racecheck "$suite" "${suite}Gpu.Parity*"
  done
fi
if [ "$what" = docs ]; then
  # Issue 47: document packing. Its GPU tests, then the attention and Taylor ops and tokens/s of
  # the six architectures' configs in stream and document mode (mean document lengths 256 and
  # 2048) at T = 2048 and 8192, then stream vs document training on Brown
  # (scripts/doc_packing_brown.sh; needs data/brown_4k.h5).
  t0=$(date +%s)
  ./build-gpu/linac_gpu_tests --gtest_brief=1 --gtest_filter='DocumentsGpu.*:AttentionGpu.*:Rope*:ModelGpu.*' \
    >"$out/docs_tests.log" 2>&1
  rc=$?
  summary+=("docs gpu tests rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/docs_tests.log" | tr '\n' ' ')")
  grep -E -A1 '^\[  FAILED|Failure|Expected|Which is|actual|Google Test trace' "$out/docs_tests.log" | head -60
  for doc in "" 256 2048; do
    ./build-gpu/linac bench --op attention --seq-lens 2048,8192 --tokens 32768 --heads 12 --head-dim 64 \
      ${doc:+--doc-len $doc} 2>&1 | tee -a "$out/docs_bench.txt"
    ./build-gpu/linac bench --op taylor --seq-lens 2048,8192 --tokens 32768 --heads 16 --head-dim 64 \
      ${doc:+--doc-len $doc} 2>&1 | tee -a "$out/docs_bench.txt"
  done
  for cfg in transformer_125m gla_340m based_360m transnormer_385m latte_macchiato_153m transformer_vq_190m; do
    for T in 2048 8192; do
      for doc in "" 256 2048; do
        ./build-gpu/linac bench configs/$cfg.json --seq-lens $T --micro-tokens 32768 --tokens-per-step 32768 \
          --steps 10 ${doc:+--doc-len $doc} --json >"$out/bench_${cfg}_T${T}_doc${doc:-stream}.json" 2>&1
        python3 -c "import json,sys; j=json.load(open(sys.argv[1])); r=j['rows'][0]; \
print(f\"{sys.argv[2]:18s} T={r['seq_len']:5d} {j['packing']:8s} doc_len={r.get('mean_doc_len',0):7.0f} \
{r['tokens_per_s']:10.0f} tok/s  step {r['step_ms']:.2f} ms (median {r['step_ms_median']:.2f})\")" \
          "$out/bench_${cfg}_T${T}_doc${doc:-stream}.json" "$cfg" 2>&1 | tee -a "$out/docs_bench.txt"
      done
    done
  done
  [ -f data/brown_4k.h5 ] && bash scripts/doc_packing_brown.sh "$out" 2>&1 | tail -12
fi
if [ "$what" = logits ]; then
  # Issue 49: does train.logits_dtype bf16 train as well as f32? Needs data/brown_32k.h5 and
  # data/brown_50k.h5 (carry them: the GPU machine has no network).
  bash scripts/logits_dtype_brown.sh "$out" 2>&1 | tail -12
fi
if [ "$what" = ckpt13b ]; then
  parts="${CKPT13B_PARTS:-tests async resume blocking}"
  # Issue 48: sharded asynchronous checkpoints of Transformer++ 1.3B on 4 GPUs under ZeRO-2 (each
  # rank writes its shard): the step loop's stall, asynchronous and blocking, the write time, the
  # bytes per rank and the load time of a resume. Random token ids (vocabulary 32000) stand in for
  # a corpus: the checkpoint does not depend on the data. First the GPU tests of data parallelism.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  if [[ " $parts " == *" tests "* ]]; then
    t0=$(date +%s)
    LINAC_BIN="$root/build-gpu/linac" ./build-gpu/linac_gpu_tests --gtest_brief=1 \
      --gtest_filter='*Dist*:*Zero*:*Bf16*' >"$out/gpu_tests_dist.log" 2>&1
    summary+=("gpu dist/zero/bf16 tests rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/gpu_tests_dist.log" | tr '\n' ' ')")
  fi
  ck="$out/ckpt13b"
  rm -rf /tmp/ckpt13b && mkdir -p /tmp/ckpt13b "$ck"
  python3 -c 'import numpy as np; np.random.default_rng(0).integers(1, 32000, 12_000_000, dtype=np.uint32).tofile("/tmp/ckpt13b/ids.bin")'
  ./build-gpu/linac prepare --token-ids /tmp/ckpt13b/ids.bin --vocab-size 32000 --eos-id 0 --out /tmp/ckpt13b/tok.h5 \
    >"$ck/prepare.log" 2>&1
  run13() {  # name, ranks, extra args
    mpirun -np "$2" --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH ./build-gpu/linac train configs/transformer_1.3b.json \
      --set data.path=/tmp/ckpt13b/tok.h5 --set train.zero=2 --set train.global_batch_tokens=524288 \
      --set train.log_every=1 --set train.eval_every=0 --set train.keep_last=2 --set train.out_dir=/tmp/ckpt13b/"$1" \
      "${@:3}" >"$ck/$1_$2.log" 2>&1
    echo "$1 on $2 GPUs rc=$?"
    grep -E "checkpoint /|resumed|fresh run|step [0-9]+/" "$ck/$1_$2.log" | sed 's/^/  /'
  }
  ranks="${CKPT13B_RANKS:-4}"  # 2 on a 2-GPU machine
  run13 async "$ranks" --set train.steps=15 --set train.checkpoint_every=5
  du -sh /tmp/ckpt13b/async/ckpt/* 2>/dev/null | sed 's/^/  /'
  ls -l /tmp/ckpt13b/async/ckpt/step_000015/ 2>/dev/null | sed 's/^/  /'
  if [[ " $parts " == *" resume "* ]]; then
    run13 async "$ranks" --set train.steps=16 --set train.checkpoint_every=5 --resume auto
    # 4 -> 2 ranks: each of the 2 reads the pieces of its shard from the 4 files.
    run13 async 2 --set train.steps=17 --set train.checkpoint_every=5 --resume auto
  fi
  rm -rf /tmp/ckpt13b/async
  [[ " $parts " == *" blocking "* ]] && run13 blocking "$ranks" --set train.steps=5 --set train.checkpoint_every=5 --set train.checkpoint_async=false
  rm -rf /tmp/ckpt13b
fi
if [ "$what" = gqa ]; then
  # Issue 50: the whole GPU suite (the attention kernels changed); linac import of random
  # LlamaForCausalLM models against transformers' logits; the attention op at 16 query / 4
  # key-value heads (D 128) through both kernel families next to SDPA with enable_gqa, and
  # multi-head for reference; decode speed and KV-cache memory of the 125M with 4 KV heads
  # against 12.
  gpu_tests "gpu tests" gqa_tests.log
  timeout 300 python3 scripts/check_hf_import.py --linac ./build-gpu/linac 2>&1 | tee "$out/hf_import.txt" | tail -20
  summary+=("hf import check rc=${PIPESTATUS[0]}")
  for kv in 4 16; do
    for fam in auto sm80; do
      LINAC_ATTENTION_KERNELS=$fam ./build-gpu/linac bench --op attention --seq-lens 2048,8192,32768 --tokens 32768 \
        --heads 16 --kv-heads $kv --head-dim 128 2>&1 | tee -a "$out/gqa_bench.txt"
    done
    timeout 120 python3 scripts/bench_torch.py --attention --heads 16 --kv-heads $kv --head-dim 128 2>&1 | tail -5 |
      tee -a "$out/gqa_bench.txt"
  done
  ./build-gpu/linac bench --op attention_decode --seq-lens 2048,8192 --tokens 262144 --heads 16 --kv-heads 4 \
    --head-dim 128 2>&1 | tee -a "$out/gqa_bench.txt"
  for kv in 4 12; do
    ./build-gpu/linac info configs/transformer_125m.json --set model.mixer.kv_heads=$kv 2>&1 | grep -iE "param|decod|KV" |
      tee -a "$out/gqa_bench.txt"
    ./build-gpu/linac bench --generate configs/transformer_125m.json --set model.mixer.kv_heads=$kv --batch 1,16,128 \
      --prompt-len 512 --gen-len 1024 2>&1 | tee -a "$out/gqa_bench.txt"
  done
fi
# The tests of decoding and of the kernels its step launches (issue 49).
decode_tests='MatmulGpu.*:SwigluLinearGpu.*:DecodeGraphGpu.*:AttentionDecodeGpu.*:GenerateGpu.*:GreedyPick*:'\
'GlaGpu.DecodeStep:*ModelGpu.*Decode*:RmsnormGpu.*:NormGateGpu.*:LogGate*:SwigluGpu.*'
if [ "$what" = decode ]; then
  # Issue 49: the decode tests (the full suite is `tests`), then decoding with and without CUDA
  # graphs for Transformer++ 125M and GLA 340M, and the 125M at the issue's 256 new tokens.
  gpu_tests "decode gpu tests" decode_tests.log "$decode_tests"
  for c in transformer_125m gla_340m; do
    for g in "" $([ "${DECODE_EAGER:-1}" = 1 ] && echo --no-graph); do
      ./build-gpu/linac bench --generate configs/$c.json --batch 1,16,128 --prompt-len 512 --gen-len 1024 $g \
        2>&1 | tee -a "$out/decode.txt"
    done
  done
  ./build-gpu/linac bench --generate configs/transformer_125m.json --batch 1,16 --prompt-len 512 --gen-len 256 \
    2>&1 | tee -a "$out/decode.txt"
  # Where a replayed step's time goes at batch 1 and 16 (kernel timeline, scripts/kernel_trace.cpp;
  # with dependent launches, the "on the chain" column is what each kernel adds to the step).
  if [ "${DECODE_TRACE:-1}" = 1 ]; then
    ninja -C build-gpu -j"${GPU_CHECK_JOBS:-16}" linac_kernel_trace >>"$out/build.log" 2>&1
    for c in transformer_125m gla_340m; do
      for b in 1 16; do
        rm -rf "/tmp/kt_$c$b" && mkdir -p "/tmp/kt_$c$b"
        KTRACE_DIR="/tmp/kt_$c$b" CUDA_INJECTION64_PATH="$root/build-gpu/liblinac_kernel_trace.so" ./build-gpu/linac bench \
          --generate configs/$c.json --batch $b --prompt-len 512 --gen-len 128 >/dev/null 2>&1
        echo "== $c, batch $b, CUDA graph" | tee -a "$out/decode_trace.txt"
        python3 scripts/kernel_trace.py "/tmp/kt_$c$b" --decode --top 14 2>&1 | tee -a "$out/decode_trace.txt"
      done
    done
  fi
fi
if [ "$what" = gemmtune ]; then
  # The GEMM tests, then per config (GEMMTUNE_CONFIGS, default the four models whose issue-49 goals
  # are open) a table from bench --tune-gemms, and the step with it and with cuBLASLt's heuristic,
  # alternating GEMMTUNE_ROUNDS times (default 2); GEMMTUNE_TOKENS tokens per step (default 32768;
  # 16384 for the 1.3B models, which then time 5 steps).
  gpu_tests "gemm gpu tests" gemmtune_tests.log 'MatmulAlgosGpu*:MatmulGpu*'
  n=${GEMMTUNE_TOKENS:-32768}
  args="--seq-lens 2048 --micro-tokens $n --tokens-per-step $n --steps $([ "$n" -ge 32768 ] && echo 10 || echo 5)"
  for c in ${GEMMTUNE_CONFIGS:-transformer_vq_190m gla_340m transformer_125m latte_macchiato_153m}; do
    ./build-gpu/linac bench "configs/$c.json" $args --tune-gemms "$out/gemms_$c.json" >"$out/gemmtune_$c.log" 2>&1
    grep -E "^tuned" "$out/gemmtune_$c.log" | tee -a "$out/gemmtune.txt"
    for _ in $(seq "${GEMMTUNE_ROUNDS:-2}"); do
      echo "$c table:     $(./build-gpu/linac bench "configs/$c.json" $args --set train.gemm_algos="$out/gemms_$c.json" \
        2>&1 | grep -E '^ +2048 ')"
      echo "$c heuristic: $(./build-gpu/linac bench "configs/$c.json" $args 2>&1 | grep -E '^ +2048 ')"
    done | tee -a "$out/gemmtune.txt"
  done
fi
if [ "$what" = table ]; then
  # Issue 49's closing table, one call: every architecture's model at T = 2048 (32,768 tokens per
  # step, 10 timed; the 1B-class models 16,384 and 5), the 125M model's PyTorch peers (eager and
  # torch.compile, bench_torch.py) right after it, and Transformer-VQ 190M against a Transformer++ of
  # its size at T = 8192 (the vq mode's pair). Results in $out/table.txt.
  step() {  # step CONFIG TOKENS STEPS [ARGS...]
    local c=$1 n=$2 k=$3; shift 3
    echo "== $c $*" | tee -a "$out/table.txt"
    timeout 150 ./build-gpu/linac bench "configs/$c.json" "$@" --micro-tokens "$n" --tokens-per-step "$n" \
      --steps "$k" 2>&1 | tail -2 | tee -a "$out/table.txt"
  }
  step transformer_125m 32768 10 --seq-lens 2048
  timeout 240 python3 scripts/bench_torch.py --model --steps 20 2>&1 | grep -E "tokens/s|Error|error" |
    tee -a "$out/table.txt"
  for c in gla_340m based_360m transnormer_385m latte_macchiato_153m transformer_vq_190m; do
    step $c 32768 10 --seq-lens 2048
  done
  for c in transformer_1.3b gla_1.3b transnormer_1b; do step $c 16384 5 --seq-lens 2048; done
  step transformer_vq_190m 32768 4 --seq-lens 8192
  step transformer_125m 32768 4 --seq-lens 8192 --set model.vocab_size=256 --set model.n_layers=24 \
    --set model.ffn_hidden=2304
fi
if [ "$what" = peers ]; then
  # Issue 49: the decode tests, then linac next to the PyTorch peers at their strongest, same
  # call: decoding Transformer++ 125M against transformers' static-cache decoding loop under
  # torch.compile's CUDA graphs and generate with a static cache and its own compile (HF_EAGER=1
  # adds eager HF with a dynamic cache), and the 125M
  # training step against bench_torch.py (fused QKV and SwiGLU GEMMs, bf16 RoPE, flash SDPA, fused
  # AdamW, torch.compile). PEERS_PARTS picks among "tests hf train" (default: all three).
  parts=" ${PEERS_PARTS:-tests hf train} "
  [[ $parts == *" tests "* ]] && gpu_tests "decode gpu tests" peers_tests.log "$decode_tests"
  if [[ $parts == *" hf "* ]]; then
    ./build-gpu/linac bench --generate configs/transformer_125m.json --batch 1,16 --prompt-len 512 \
      --gen-len "${PEERS_GEN_LEN:-1024}" 2>&1 | tee -a "$out/peers.txt"
    peers=("--attn sdpa --loop" "--attn sdpa --cache static --compile")
    [ -n "${HF_PEERS:-}" ] && IFS=';' read -r -a peers <<<"$HF_PEERS"
    [ "${HF_EAGER:-0}" = 1 ] && peers+=("--attn eager")
    for peer in "${peers[@]}"; do
      timeout "${HF_TIMEOUT:-170}" python3 scripts/bench_hf_generate.py --linac-config configs/transformer_125m.json \
        --batch 1,16 --prompt-len 512 --gen-len "${PEERS_GEN_LEN:-1024}" $peer 2>>"$out/bench_hf.err" |
        tee -a "$out/peers.txt"
    done
    tail -3 "$out/bench_hf.err"
  fi
  if [[ $parts == *" train "* ]]; then
    ./build-gpu/linac bench configs/transformer_125m.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
      --steps 20 2>&1 | tee -a "$out/peers.txt"
    timeout 240 python3 scripts/bench_torch.py --model --steps 20 --compile-modes "${TORCH_COMPILE_MODES:-default}" 2>&1 |
      grep -E "tokens/s|Error|error" | tee -a "$out/peers.txt"
  fi
fi
printf '%s\n' "${summary[@]}"
