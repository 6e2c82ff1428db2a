# scripts/gpu_check.sh modes, sourced by it: where the time goes (none is part of `all`).
#   gemms      the GEMMs of the 125M and GLA 340M steps by problem, and Nsight Compute's view of them
#   gla        the GLA op and the 340M step, Nsight Compute's per-kernel table of one 340M layer
#              (kernels/gla/NOTES.md)
#   taylor     the Taylor op, Nsight Compute's view of its kernels at T = 8192 (warp states and
#              instruction counts) and their SASS loops (scripts/sass_mix.py; kernels/taylor_attn/NOTES.md)
#   latteprof  the Latte core's backward kernels and the window attention's backward under Nsight
#              Compute, where their warps wait (scripts/ncu_stalls.py; kernels/latte/NOTES.md,
#              kernels/attention/NOTES.md)
#   xentprof   the loss's register-row kernels under Nsight Compute: the 125M model's 32,000 logits
#              held as f32, Latte-Macchiato's 50,264 packed as bf16 (kernels/cross_entropy/NOTES.md)
#   swiglubwd  the SwiGLU backward GEMM (kernels/swiglu/NOTES.md): its per-layer time in the 125M and
#              Transformer++ 1.3B steps, one launch under Nsight Compute (where its warps wait, its
#              tensor pipe, shared-memory and L2 traffic) and its SASS loops
#   ropeprof   the QKV GEMM with RoPE in its epilogue and the SwiGLU forward under Nsight Compute
#              (kernels/rope/NOTES.md)
#   attnprof   the Hopper attention kernels under Nsight Compute, forward and backward at head dims 64
#              and 128 (T = 2048, 16 heads, 32,768 tokens): durations, DRAM and L2 rates, where their
#              warps wait (kernels/attention/NOTES.md, "The forward's item order")
#   memprof    the Transformer++ 1.3B step's phases, then its memory-bound kernels (AdamW, RMSNorm, the
#              gradient norm's reduction) under Nsight Compute: DRAM throughput and bytes moved
#              (docs/performance.md, "Memory-bound passes of the 1.3B step at their bandwidth")
#   power      each model's step with the GPU's power draw and SM clock sampled (scripts/power_summary.py),
#              then the SM clock and tensor-pipe occupancy of one 125M step's GEMM kernels under Nsight
#              Compute (docs/performance.md, "What holds the GEMMs")
#   gemmtune   GEMM algorithm tables (docs/gemm_tuning.md) tuned per model, the step with and without
#              them, alternating

# ncu_prof LOG NAME KERNEL_REGEX BENCH_ARGS...: one launch of the kernel under Nsight Compute in
# `linac bench BENCH_ARGS`, its durations and rates (scripts/ncu_summary.py) and where its warps
# wait (scripts/ncu_stalls.py: stall reasons, mbarrier waits, the busiest instructions), into LOG.
ncu_prof() {
  local log=$1 name=$2 kernel=$3
  shift 3
  local secs="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
    --section SourceCounters --section SchedulerStats --section InstructionStats"
  # shellcheck disable=SC2086  # secs is a list of words
  ncu --clock-control none -k "regex:$kernel" --launch-count 1 $secs -o "$out/$name" \
    ./build-gpu/linac bench "$@" >"$out/$name.err" 2>&1
  ncu -i "$out/$name.ncu-rep" --csv --page details >"$out/$name.csv" 2>&1
  ncu -i "$out/$name.ncu-rep" --csv --page source --print-source sass >"$out/${name}_source.csv" 2>&1
  { python3 scripts/ncu_summary.py "$out/$name.csv"; python3 scripts/ncu_stalls.py "$out/${name}_source.csv"; } 2>&1 |
    tee -a "$out/$log"
  rm -f "$out/$name.ncu-rep" "$out/$name.csv" "$out/${name}_source.csv"
}
# gemm_kernels_ncu LOG NAME: every GEMM kernel (cuBLASLt's and ours) of one step of a 2-layer 125M
# model under Nsight Compute, a line each (scripts/ncu_summary.py: duration, SM, L2 and DRAM
# throughputs, SM clock, tensor-pipe occupancy, grid and cluster size) appended to LOG.
gemm_kernels_ncu() {
  ncu --clock-control none -k 'regex:gemm|xmma|nvjet|swiglu_linear|rope_linear|silu_linear|cutlass|splitK|reduce' \
    --launch-count 60 --section SpeedOfLight --section LaunchStats --section MemoryWorkloadAnalysis \
    --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed --csv --page details \
    ./build-gpu/linac bench configs/transformer_125m.json --set model.n_layers=2 --seq-lens 2048 \
    --micro-tokens 32768 --tokens-per-step 32768 --steps 1 --warmup 1 >"$out/$2.csv" 2>"$out/$2.err"
  python3 scripts/ncu_summary.py "$out/$2.csv" 2>&1 | tee -a "$out/$1"
}
if [ "$what" = gemms ]; then
  # Where the GEMM time of a step goes: --profile's problem table (each GEMM shape's ms and
  # TFLOP/s) for both models, then Nsight Compute's view of every GEMM kernel of a 125M step.
  for c in transformer_125m gla_340m; do
    ./build-gpu/linac bench configs/$c.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
      --steps 10 --profile 2>&1 | tee -a "$out/gemms.txt"
  done
  gemm_kernels_ncu gemms.txt ncu_gemms
fi
if [ "$what" = power ]; then
  # Whether the steps run at the power limit: nvidia-smi samples every 50 ms while each model
  # trains (the fields that this driver lacks left out), the samples under load summarised; then
  # Nsight Compute's view of every GEMM kernel of a 125M step, clock and tensor pipe included.
  fields=power.draw,power.limit,clocks.sm,clocks_event_reasons.sw_power_cap
  nvidia-smi --query-gpu=$fields --format=csv,nounits -i 0 >/dev/null 2>&1 || fields=power.draw,power.limit,clocks.sm
  for spec in "transformer_125m 32768 60" "gla_340m 32768 30" "based_360m 32768 30" "transnormer_385m 32768 30" \
    "latte_macchiato_153m 32768 60" "transformer_vq_190m 32768 30" "transformer_1.3b 16384 20" "gla_1.3b 16384 20"; do
    read -r c n k <<<"$spec"
    nvidia-smi --query-gpu=$fields --format=csv,nounits -i 0 -lms 50 >"$out/smi_$c.csv" 2>&1 &
    smi=$!
    echo "== $c" | tee -a "$out/power.txt"
    ./build-gpu/linac bench "configs/$c.json" --seq-lens 2048 --micro-tokens "$n" --tokens-per-step "$n" --steps "$k" \
      2>&1 | tail -1 | tee -a "$out/power.txt"
    kill $smi
    wait $smi 2>/dev/null
    python3 scripts/power_summary.py "$out/smi_$c.csv" 2>&1 | tee -a "$out/power.txt"
  done
  gemm_kernels_ncu power.txt ncu_power
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
  # kernels and the window attention's backward (8 heads of 96, window 129) at the model's shape.
  op=(--seq-lens 2048 --tokens 32768 --iters 1)
  latte=(--op latte --heads 8 --head-dim 96 --latents 16 --macchiato "${op[@]}")
  ncu_prof latteprof.txt latte_grad_p grad_p_kernel "${latte[@]}"
  ncu_prof latteprof.txt latte_grad_bv grad_bv_kernel "${latte[@]}"
  ncu_prof latteprof.txt window_bwd bwd_sm90_kernel --op attention --heads 8 --head-dim 96 --window 129 "${op[@]}"
fi
if [ "$what" = xentprof ]; then
  # The loss of a one-layer model's step at T = 2048, 32,768 rows (the first launch: one chunk of
  # the LM head's rows).
  for c in transformer_125m latte_macchiato_153m; do
    ncu_prof xentprof.txt "xent_$c" cross_entropy_rows_sm90 configs/$c.json --set model.n_layers=1 \
      --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 --steps 1 --warmup 1
  done
fi
if [ "$what" = swiglubwd ]; then
  # Whichever SwiGLU backward this tree builds (the NOTES' experiments are commits: check one's
  # kernel file out before the call to profile it).
  for spec in "transformer_125m 32768" "transformer_1.3b 16384"; do
    read -r c n <<<"$spec"
    ./build-gpu/linac bench "configs/$c.json" --seq-lens 2048 --micro-tokens "$n" --tokens-per-step "$n" --steps 3 \
      --profile 2>&1 | grep -E 'gate bwd|^ +2048 ' | tee -a "$out/swiglubwd.txt"
  done
  ncu_prof swiglubwd.txt swiglu_bwd swiglu_linear_bwd_kernel configs/transformer_125m.json --set model.n_layers=1 \
    --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 --steps 1 --warmup 1
  "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" -sass \
    build-gpu/CMakeFiles/linac_kernels_sm90a.dir/kernels/swiglu/swiglu_linear_bwd_sm90.cu.o >"$out/swiglu_bwd.sass" 2>&1
  python3 scripts/sass_mix.py --kernel swiglu_linear_bwd_kernel "$out/swiglu_bwd.sass" 2>&1 | tee -a "$out/swiglubwd.txt"
fi
if [ "$what" = attnprof ]; then
  for d in 64 128; do
    for kernel in fwd bwd; do
      ncu_prof attnprof.txt "attn_${kernel}_d$d" "${kernel}_sm90_kernel" --op attention --seq-lens 2048 --tokens 32768 \
        --heads 16 --head-dim "$d" --iters 3
    done
  done
fi
if [ "$what" = ropeprof ]; then
  # The QKV GEMM with RoPE in its epilogue next to the SwiGLU forward, the kernel on the same
  # pipeline with the higher tensor-pipe share: one launch of each under Nsight Compute in a 1-layer
  # 125M step (kernels/rope/NOTES.md, "What limits the fused GEMM"), and their SASS loops.
  args="configs/transformer_125m.json --set model.n_layers=1 --seq-lens 2048 --micro-tokens 32768
    --tokens-per-step 32768 --steps 1 --warmup 1"
  # shellcheck disable=SC2086  # args is a list of words
  ncu_prof ropeprof.txt rope_fwd rope_linear_fwd_kernel $args
  # shellcheck disable=SC2086
  ncu_prof ropeprof.txt swiglu_fwd swiglu_linear_fwd_kernel $args
  "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" -sass \
    build-gpu/CMakeFiles/linac_kernels_sm90a.dir/kernels/rope/rope_linear_sm90.cu.o >"$out/rope_fwd.sass" 2>&1
  python3 scripts/sass_mix.py --kernel rope_linear_fwd_kernel "$out/rope_fwd.sass" 2>&1 | tee -a "$out/ropeprof.txt"
fi
if [ "$what" = memprof ]; then
  ./build-gpu/linac bench configs/transformer_1.3b.json --seq-lens 2048 --micro-tokens 16384 --tokens-per-step 16384 \
    --steps 4 --profile 2>&1 | tee -a "$out/memprof.txt"
  ncu --clock-control none -k 'regex:adamw|reduce_partial|rmsnorm|add_slab' --launch-count 40 \
    --section SpeedOfLight --section LaunchStats --metrics dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --page details ./build-gpu/linac bench configs/transformer_1.3b.json --set model.n_layers=2 \
    --seq-lens 2048 --micro-tokens 16384 --tokens-per-step 16384 --steps 1 --warmup 1 \
    >"$out/ncu_mem.csv" 2>"$out/ncu_mem.err"
  python3 scripts/ncu_summary.py "$out/ncu_mem.csv" 2>&1 | tee -a "$out/memprof.txt"
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
