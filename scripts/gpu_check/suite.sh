# scripts/gpu_check.sh modes, sourced by it (helpers and variables there): the default session.
#   tests     the whole GPU suite (linac_gpu_tests)
#   bench     the attention op and the 125M step, then perf and every architecture below
#   perf      the attention kernels through both kernel families next to SDPA / FlexAttention, the 125M
#             step with its profile next to PyTorch eager and torch.compile, GLA 340M and its op (issue 15)
#   based, tnl, latte, vq   one architecture's op and model benchmarks
#   generate  decode tests, the HF export check, decode benchmarks
# `all` runs these in this order.
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
