#!/usr/bin/env bash
# Data-parallel scaling of `linac bench` on 1..N GPUs of one host (weak scaling: every rank
# trains the same per-rank batch). Prints GPUs, tokens/s, tokens/s per GPU, efficiency vs 1 GPU
# (from the mean step, and from the median step: a few slow steps of the whole host weigh on the
# mean alone) and rank 0's peak memory. The 1-GPU run is made once per config: with one rank there is
# nothing to overlap, shard or reduce, so it is every setting's baseline (its row shows "-" for them).
#   scripts/scaling.sh [BUILD_DIR] [GPU counts, default "1 2 4 8" capped at the GPUs present]
#   CONFIGS="configs/transformer_125m.json configs/gla_340m.json" OVERLAP="true false" ZERO="0 1"
#   REDUCE="f32 bf16" (train.reduce_dtype) override the settings; MICRO_PER_RANK (default 1) sets the
#   micro-batches of 32768 tokens (T = 2048) per rank per step, the baseline's too; STEPS and WARMUP
#   (default 10 and 3) the timed and warm-up steps; NCCL_ENV="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
#   exports those variables and forwards them to every rank (-x), e.g. for NCCL's network transport.
set -uo pipefail
build="${1:-build}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
avail=$(nvidia-smi -L | wc -l)
counts="${2:-1 2 4 8}"
configs="${CONFIGS:-configs/transformer_125m.json configs/gla_340m.json}"
overlaps="${OVERLAP:-true false}"
zeros="${ZERO:-0}"
reduces="${REDUCE:-f32}"
micro="${MICRO_PER_RANK:-1}"
steps="${STEPS:-10}"
warmup="${WARMUP:-3}"
forward=(-x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
for kv in ${NCCL_ENV:-}; do
  export "$kv"
  forward+=(-x "${kv%%=*}")
done

# "tokens/s peak_bytes median_step_ms" of one run on $1 GPUs of config $2 with overlap $3, ZeRO $4
# and reduce dtype $5, or nothing.
run() {
  mpirun -np "$1" --bind-to none "${forward[@]}" "$root/$build/linac" bench "$root/$2" \
    --seq-lens 2048 --micro-tokens 32768 --tokens-per-step $((micro * 32768)) --steps "$steps" --warmup "$warmup" \
    --json --set train.overlap_comm="$3" --set train.zero="$4" --set train.reduce_dtype="$5" 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["rows"][0]; print(r["tokens_per_s"], r["peak_bytes"], r["step_ms_median"])'
}
# One table row: config, overlap, zero, reduce dtype, GPUs, this run's and the 1-GPU run's
# "tokens/s peak median".
row() {
  python3 - "$@" <<'PY'
import sys
cfg, ov, z, rd, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
tps, peak, med = (float(v) for v in sys.argv[6].split())
base_tps, _, base_med = (float(v) for v in sys.argv[7].split())
print(f"{cfg:<34} {ov:<8} {z:>4} {rd:>6} {n:5d} {tps:12.0f} {tps/n:12.0f} {100*tps/(n*base_tps):9.1f}% "
      f"{100*base_med/med:9.1f}% {peak/2**30:8.2f} GiB")
PY
}

echo "# $micro micro-batch(es) of 32768 tokens per rank per step, $steps timed after $warmup warm-up${NCCL_ENV:+, $NCCL_ENV}"
printf '%-34s %-8s %4s %6s %5s %12s %12s %10s %10s %10s\n' config overlap zero reduce GPUs tokens/s per-GPU efficiency \
  '(median)' peak
for cfg in $configs; do
  [ -f "$root/$cfg" ] || { echo "skip $cfg (missing)"; continue; }
  res=$(run 1 "$cfg" true 0 f32)
  [ -n "$res" ] || { echo "$cfg on 1 GPU failed"; continue; }
  base=$res
  row "$cfg" - - - 1 "$res" "$base"
  for ov in $overlaps; do
    for z in $zeros; do
      for rd in $reduces; do
        for n in $counts; do
          [ "$n" -gt 1 ] && [ "$n" -le "$avail" ] || continue
          res=$(run "$n" "$cfg" "$ov" "$z" "$rd")
          [ -n "$res" ] || { echo "$cfg on $n GPUs (overlap $ov, zero $z, reduce $rd) failed"; continue; }
          row "$cfg" "$ov" "$z" "$rd" "$n" "$res" "$base"
        done
      done
    done
  done
done
