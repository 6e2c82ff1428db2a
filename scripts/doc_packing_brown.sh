#!/usr/bin/env bash
# Stream vs document packing on Brown (issue 47): Transformer++ and GLA quickstart-shaped models
# (4 layers, d_model 256, vocab 4096) trained on the same token budget with data.packing "stream"
# and "document", each validation split then scored both ways (`linac eval --packing`).
#   scripts/doc_packing_brown.sh [OUT_DIR]     (needs data/brown_4k.h5 and build-gpu/linac or LINAC;
#   BROWN_STEPS sets the steps, default 800 = 6.6M tokens, about 4 epochs of the train split)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/doc_packing_out}"
linac="${LINAC:-$root/build-gpu/linac}"
cd "$root"
mkdir -p "$out"
common=(--set data.seq_len=512 --set train.micro_batch=16 --set train.global_batch_tokens=8192
        --set train.steps=${BROWN_STEPS:-800} --set train.warmup_steps=$(( ${BROWN_STEPS:-800} / 16 )) --set train.eval_every=200 --set train.eval_tokens=1000000
        --set train.checkpoint_every=${BROWN_STEPS:-800} --set train.log_every=100)
printf '%-12s %-9s %12s %12s\n' model trained "val(stream)" "val(doc)" | tee "$out/brown_packing.txt"
for cfg in quickstart gla_quickstart; do
  for packing in stream document; do
    run="$out/runs/${cfg}_$packing"
    rm -rf "$run"
    "$linac" train "configs/$cfg.json" "${common[@]}" --set data.packing=$packing --set train.out_dir="$run" \
      >"$out/${cfg}_$packing.log" 2>&1
    ckpt="$(ls "$run"/ckpt/step_*.h5 | tail -1)"
    vs=$("$linac" eval --checkpoint "$ckpt" --packing stream --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
    vd=$("$linac" eval --checkpoint "$ckpt" --packing document --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
    printf '%-12s %-9s %12.4f %12.4f\n' "${cfg%_quickstart}" "$packing" "$vs" "$vd" | tee -a "$out/brown_packing.txt"
  done
done
