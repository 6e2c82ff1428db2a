# scripts/gpu_check.sh modes, sourced by it: several GPUs or memory plans (none is part of `all`).
#   zero1         (1 GPU) recompute: the gradients bit for bit, the 1.3B models' speed and memory in
#                 each recompute mode, issue 16
#   zero4         (4 GPUs) the ZeRO and data-parallel tests, scaling with the reduction overlapped or
#                 not and ZeRO-1 off or on, rank 0's profile of the 125M step, issue 16
#   nettransport  (2 or 4 GPUs) data-parallel scaling over NCCL's network transport, gradients reduced
#                 in f32 and in bf16, issue 48
#   zero4mem      (4 GPUs) the 1.3B models' peak memory per GPU with ZeRO 0, 1, 2 next to `linac info`'s plan
#   trace4        (4 GPUs) every rank's kernel timeline of the 125M and GLA 340M steps, overlapped
#                 (scripts/kernel_trace.cpp/.py; $OUT/traces.tgz holds the CSVs)
#   ckpt13b       (4 GPUs) sharded asynchronous checkpoints of the 1.3B model and the data-parallel
#                 GPU tests, issue 48
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
