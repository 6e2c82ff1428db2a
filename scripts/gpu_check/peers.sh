# scripts/gpu_check.sh modes, sourced by it: linac next to its PyTorch peers (none is part of `all`).
#   decode  the decode tests, decoding with and without CUDA graphs (DECODE_EAGER=0: only with;
#           DECODE_TRACE=0: no kernel timelines; DECODE_CONFIGS, DECODE_BATCHES: the models and
#           batch sizes, default "transformer_125m gla_340m" and 1,16,128)
#   peers   the 125M model's decoding and training step next to the strongest PyTorch and HF peers,
#           issue 49
#   table   every architecture's step and the 125M model's PyTorch peers in one call, issue 49
#           (TABLE_RESIDUAL="f32 bf16": each linac row with each train.residual_dtype; default bf16,
#           the default's choice under bf16 precision)
#   logits  f32 against bf16 logits trained on Brown (scripts/logits_dtype_brown.sh), issue 49
#   residual  the same for an f32 against a bf16 residual stream (train.residual_dtype)
#   fla     GLA 340M and the GLA, lightning and Taylor ops next to flash-linear-attention's model and
#           kernels (scripts/bench_fla.py; its source snapshot under .peers/, carried), issue 49; fla's
#           Triton autotuning takes minutes on a fresh machine, so this wants a call of its own
#           (FLA_TIMEOUT bounds the Python part: default 360 s, so that the build and linac's side fit
#           the same 600 s call; FLA_ARGS adds e.g. --no-compile or --no-eager)
# The tests of decoding and of the kernels its step launches (issue 49).
decode_tests='MatmulGpu.*:SwigluLinearGpu.*:DecodeGraphGpu.*:AttentionDecodeGpu.*:GenerateGpu.*:GreedyPick*:'\
'GlaGpu.DecodeStep:*ModelGpu.*Decode*:RmsnormGpu.*:NormGateGpu.*:LogGate*:SwigluGpu.*:VqAttn*Gpu.*Decode*:'\
'VqAttnGpu.Prefill*:Rope*:LatteGpu.*'
if [ "$what" = decode ]; then
  # Issue 49: the decode tests (the full suite is `tests`), then decoding with and without CUDA
  # graphs (Transformer++ 125M and GLA 340M unless DECODE_CONFIGS says otherwise), and the 125M at
  # the issue's 256 new tokens.
  gpu_tests "decode gpu tests" decode_tests.log "$decode_tests"
  for c in ${DECODE_CONFIGS:-transformer_125m gla_340m}; do
    for g in "" $([ "${DECODE_EAGER:-1}" = 1 ] && echo --no-graph); do
      ./build-gpu/linac bench --generate configs/$c.json --batch "${DECODE_BATCHES:-1,16,128}" --prompt-len 512 \
        --gen-len 1024 $g \
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
if [ "$what" = peers ]; then
  # Issue 49: the decode tests, then linac next to the PyTorch peers at their strongest, same
  # call: decoding Transformer++ 125M against transformers' static-cache decoding loop under
  # torch.compile's CUDA graphs and generate with a static cache and its own compile (HF_EAGER=1
  # adds eager HF with a dynamic cache), and the 125M
  # training step against bench_torch.py (fused QKV and SwiGLU GEMMs, bf16 RoPE, flash SDPA, fused
  # AdamW, torch.compile), linac's step with each residual stream (PEERS_RESIDUAL, default "f32 bf16":
  # autocast keeps PyTorch's stream in f32). PEERS_PARTS picks among "tests hf train" (default: all).
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
    for r in ${PEERS_RESIDUAL:-f32 bf16}; do
      ./build-gpu/linac bench configs/transformer_125m.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
        --steps 20 --set train.residual_dtype="$r" 2>&1 | tee -a "$out/peers.txt"
    done
    timeout 240 python3 scripts/bench_torch.py --model --steps 20 --compile-modes "${TORCH_COMPILE_MODES:-default}" 2>&1 |
      grep -E "tokens/s|Error|error" | tee -a "$out/peers.txt"
  fi
fi
if [ "$what" = table ]; then
  # Issue 49's closing table, one call: every architecture's model at T = 2048 (32,768 tokens per
  # step, 10 timed; the 1B-class models 16,384 and 5), the 125M model's PyTorch peers (eager and
  # torch.compile, bench_torch.py) right after it, and Transformer-VQ 190M against a Transformer++ of
  # its size at T = 8192 (the vq mode's pair). Results in $out/table.txt.
  step() {  # step CONFIG TOKENS STEPS [ARGS...]
    local c=$1 n=$2 k=$3 r; shift 3
    for r in ${TABLE_RESIDUAL:-bf16}; do
      echo "== $c $* (residual $r)" | tee -a "$out/table.txt"
      timeout 150 ./build-gpu/linac bench "configs/$c.json" "$@" --micro-tokens "$n" --tokens-per-step "$n" \
        --steps "$k" --set train.residual_dtype="$r" 2>&1 | tail -2 | tee -a "$out/table.txt"
    done
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
if [ "$what" = logits ]; then
  # Issue 49: does train.logits_dtype bf16 train as well as f32? Needs data/brown_32k.h5 and
  # data/brown_50k.h5 (carry them: the GPU machine has no network).
  bash scripts/logits_dtype_brown.sh "$out" 2>&1 | tail -12
fi
if [ "$what" = residual ]; then
  # Does train.residual_dtype bf16 train as well as f32? Same runs, data and carrying as logits.
  DTYPE_KEY=residual_dtype bash scripts/logits_dtype_brown.sh "$out" 2>&1 | tail -12
fi
if [ "$what" = fla ]; then
  # Issue 49's GLA goal is stated against PyTorch with fla's Triton GLA: linac's 340M step and ops,
  # then fla's model and kernels at the same shapes, in this call. fla and einops come from .peers/.
  fla_path="$root/.peers${PYTHONPATH:+:$PYTHONPATH}"
  if ! PYTHONPATH="$fla_path" python3 -c 'import fla, einops' 2>"$out/fla_import.txt"; then
    echo "fla: no importable fla + einops under .peers/ (docs/performance.md says how to make it)"
    tail -3 "$out/fla_import.txt"
  else
    ./build-gpu/linac bench configs/gla_340m.json --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 \
      --steps 10 2>&1 | tee -a "$out/fla.txt"
    ./build-gpu/linac bench --op gla --seq-lens 2048,8192,32768 --tokens 32768 --heads 4 --dk 128 --dv 256 \
      2>&1 | tee -a "$out/fla.txt"
    ./build-gpu/linac bench --op lightning --seq-lens 2048,8192,32768 --tokens 32768 --heads 16 --head-dim 64 \
      2>&1 | tee -a "$out/fla.txt"
    ./build-gpu/linac bench --op taylor --seq-lens 2048,8192,32768 --tokens 32768 --heads 16 --head-dim 64 \
      2>&1 | tee -a "$out/fla.txt"
    # Triton's compiled kernels and fla's autotuning results (FLA_CACHE_RESULTS, on by default) are
    # kept between calls: this call's cache goes back as $OUT/triton_cache.tgz.0, .1, .2 (15 MiB
    # parts, as a returned file may have 16), without the intermediate IRs that a cache hit does
    # not read; parts put under .peers/ are unpacked first (sm_90 code: an H100's serves an H200).
    # Three parts at most, so that they and the fla snapshot stay within what a call may carry.
    # A kernel with a cached result is neither compiled in its other configurations nor timed.
    export TRITON_CACHE_DIR="$root/.peers/triton_cache"
    mkdir -p "$TRITON_CACHE_DIR"
    if compgen -G "$root/.peers/triton_cache.tgz.*" >/dev/null; then
      cat "$root"/.peers/triton_cache.tgz.* | tar -xz -C "$TRITON_CACHE_DIR"
    fi
    PYTHONPATH="$fla_path" PYTHONUNBUFFERED=1 timeout "${FLA_TIMEOUT:-360}" python3 scripts/bench_fla.py \
      --ops --model ${FLA_ARGS:-} 2>&1 | grep --line-buffered -v Warning | tee -a "$out/fla.txt"
    tar -cz --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.source' \
      -C "$TRITON_CACHE_DIR" . | split -b 15M -d -a 1 - "$out/triton_cache.tgz."
    parts=$(compgen -G "$out/triton_cache.tgz.*" | wc -l)
    echo "triton cache: $(du -sh "$TRITON_CACHE_DIR" | cut -f1) unpacked, $parts part(s) of 15 MiB packed"
    if [ "$parts" -gt 3 ]; then
      echo "triton cache: more than three parts, not returned"
      rm -f "$out"/triton_cache.tgz.*
    fi
  fi
fi
