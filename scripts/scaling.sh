#!/usr/bin/env bash
# Data-parallel scaling of `linac bench` on 1..N GPUs of one host (weak scaling: every rank
# trains the same per-rank batch). Prints GPUs, tokens/s, tokens/s per GPU, efficiency vs 1 GPU
# (of the same overlap and ZeRO setting) and rank 0's peak memory.
#   scripts/scaling.sh [BUILD_DIR] [GPU counts, default "1 2 4 8" capped at the GPUs present]
#   CONFIGS="configs/transformer_125m.json configs/gla_340m.json" OVERLAP="true false" ZERO="0 1" override.
set -uo pipefail
build="${1:-build}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
avail=$(nvidia-smi -L | wc -l)
counts="${2:-1 2 4 8}"
configs="${CONFIGS:-configs/transformer_125m.json configs/gla_340m.json}"
overlaps="${OVERLAP:-true false}"
zeros="${ZERO:-0}"
printf '%-34s %-8s %4s %5s %12s %12s %10s %10s\n' config overlap zero GPUs tokens/s per-GPU efficiency peak
for cfg in $configs; do
  [ -f "$root/$cfg" ] || { echo "skip $cfg (missing)"; continue; }
  for ov in $overlaps; do
   for z in $zeros; do
    base=""
    for n in $counts; do
      [ "$n" -le "$avail" ] || continue
      row=$(mpirun -np "$n" --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH "$root/$build/linac" bench "$root/$cfg" \
              --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 --steps 10 --warmup 3 --json \
              --set train.overlap_comm=$ov --set train.zero=$z 2>/dev/null |
            python3 -c 'import json,sys; r=json.load(sys.stdin)["rows"][0]; print(r["tokens_per_s"], r["peak_bytes"])')
      [ -n "$row" ] || { echo "$cfg on $n GPUs failed"; continue; }
      tps=${row% *}
      [ -z "$base" ] && base="$tps"
      python3 - "$cfg" "$ov" "$z" "$n" "$tps" "$base" "${row#* }" <<'PY'
import sys
cfg, ov, z, n, tps, base, peak = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
print(f"{cfg:<34} {ov:<8} {z:>4} {n:5d} {tps:12.0f} {tps/n:12.0f} {100*tps/(n*base):9.1f}% {peak/2**30:8.2f} GiB")
PY
    done
   done
  done
done
