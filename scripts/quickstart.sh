#!/usr/bin/env bash
# One command on a fresh machine: install, build, fetch + tokenise the Brown corpus, train
# configs/quickstart.json (on the GPU if there is one, else the CPU), evaluate, and say where
# everything is.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"

bash scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)" --target linac
export OMP_WAIT_POLICY=passive

bash scripts/get_corpus.sh brown
if [ ! -f data/brown_4k.h5 ]; then
  "$build/linac" prepare --input data/brown --out data/brown_4k.h5 --vocab-size 4096 --val-fraction 0.02
fi
"$build/linac" info configs/quickstart.json
"$build/linac" train configs/quickstart.json --resume auto
ckpt="runs/quickstart/ckpt/$(cat runs/quickstart/ckpt/latest)"
"$build/linac" eval --checkpoint "$ckpt" --data data/brown_4k.h5
cat <<MSG

quickstart done:
  run directory   runs/quickstart   (config.json, train.log, metrics.jsonl, ckpt/)
  checkpoint      $ckpt
  dataset         data/brown_4k.h5  (tokenizer embedded)
MSG
