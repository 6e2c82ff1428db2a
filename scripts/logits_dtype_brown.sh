#!/usr/bin/env bash
# f32 vs bf16 logits (train.logits_dtype) on Brown: Transformer++ 125M (untied head, vocabulary
# 32,000) and Latte-Macchiato 153M (tied, 50,264) trained on the same batches from the same seeds
# with each logits dtype, then every final checkpoint scored with f32 logits by `linac eval` (the
# in-training validation loss uses the run's own logits dtype, so it is not comparable across them).
#   scripts/logits_dtype_brown.sh [OUT_DIR]
# Needs data/brown_32k.h5 and data/brown_50k.h5 (`linac prepare --input data/brown --out
# data/brown_32k.h5 --vocab-size 32000 --val-fraction 0.02`, likewise 50264) and build-gpu/linac
# or LINAC. LOGITS_SEEDS (default "1 2") and LOGITS_STEPS (default 300: 4.9M tokens, about four
# epochs of the train split) set the runs, LOGITS_MODELS the models (config:dataset:vocabulary ...).
# DTYPE_KEY=residual_dtype compares train.residual_dtype f32 / bf16 the same way instead (eval runs
# with an f32 stream and f32 logits either way).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/logits_dtype_out}"
linac="${LINAC:-$root/build-gpu/linac}"
cd "$root"
mkdir -p "$out/runs"
steps=${LOGITS_STEPS:-300}
key=${DTYPE_KEY:-logits_dtype}
common=(--set data.seq_len=1024 --set train.micro_batch=16 --set train.global_batch_tokens=16384
        --set train.steps=$steps --set train.warmup_steps=$(( steps / 10 )) --set train.eval_every=$steps
        --set train.eval_tokens=1000000 --set train.checkpoint_every=$steps --set train.log_every=10)
printf '%-16s %-6s %4s %10s %14s %14s\n' model "${key%_dtype}" seed train "val(own dtype)" "val(f32 eval)" |
  tee "$out/$key.txt"
for spec in ${LOGITS_MODELS:-transformer_125m:brown_32k:32000 latte_macchiato_153m:brown_50k:50264}; do
  IFS=: read -r cfg data vocab <<<"$spec"
  for seed in ${LOGITS_SEEDS:-1 2}; do
    for dtype in f32 bf16; do
      run="$out/runs/${cfg}_${dtype}_s$seed"
      rm -rf "$run"
      "$linac" train "configs/$cfg.json" "${common[@]}" --set data.path="data/$data.h5" --set model.vocab_size=$vocab \
        --set train.seed=$seed --set train.$key=$dtype --set train.out_dir="$run" >"$run.log" 2>&1
      train=$(grep -oE "step $steps/$steps \| loss [0-9.]+" "$run.log" | awk '{print $NF}')
      val=$(grep -oE "step $steps \| val loss [0-9.]+" "$run.log" | awk '{print $NF}')
      ckpt="$(ls "$run"/ckpt/step_*.h5 | tail -1)"
      ev=$("$linac" eval --checkpoint "$ckpt" --json 2>>"$run.log" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
      printf '%-16s %-6s %4s %10.4f %14.4f %14.4f\n' "${cfg}" "$dtype" "$seed" "$train" "$val" "$ev" |
        tee -a "$out/$key.txt"
      rm -rf "$run/ckpt"
    done
  done
done
