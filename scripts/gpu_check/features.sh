# scripts/gpu_check.sh modes, sourced by it: one feature's checks each (none is part of `all`).
#   compare   scripts/compare.sh, issue 17
#   sanitize  compute-sanitizer memcheck and racecheck over the parity tests
#   docs      document packing's tests, benchmarks and Brown runs, issue 47
#   gqa       the GPU suite, linac import against transformers, grouped-query attention next to SDPA
#             and GQA decoding against multi-head, issue 50
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
