#!/usr/bin/env bash
# A/B of this tree against one or more baseline source trees on one GPU machine, in one call:
#   - builds each baseline's `linac` (AB_BASE: space-separated trees, each into its build-gpu; side
#     by side, GPU_CHECK_JOBS (16) shared among them) in the background while the GPU tests that
#     AB_TESTS names (a gtest filter; none when empty) run on this tree's build-gpu (made first by
#     scripts/gpu_check.sh, e.g. GPU_CHECK_TARGETS="linac linac_gpu_tests" ... none);
#   - then, through scripts/ab.sh (the binaries alternating, this tree's first, AB_ROUNDS rounds,
#     default 3), each model bench of AB_CONFIGS (space-separated configs; T = 2048, 32,768 tokens
#     per step) and each op bench of AB_OPS (';'-separated `linac bench` argument lists; a
#     --seq-lens list runs one T at a time), and each model's mean ms per step on every side.
# Two baselines attribute a gain between two changes (the tree before both, and after the first).
# The device machine gets the working tree without .git, so a baseline is a plain copy made
# before the call and left untracked (git must not ignore it, or it is not carried):
#   rm -rf ab_base && mkdir ab_base && git archive main | tar -x -C ab_base
#   AB_BASE=ab_base AB_TESTS='*Latte*' AB_CONFIGS=configs/latte_macchiato_153m.json \
#     AB_OPS='--op latte --seq-lens 2048 --heads 8 --head-dim 96 --latents 16 --macchiato' scripts/ab_compare.sh
# Logs go to $OUT (or ./gpu_check_out): ab.log, ab_tests.log, and ab_base_build.log (one
# baseline) or ab_build_NAME.log (each of several, NAME its folder's name).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/gpu_check_out}"
mkdir -p "$out"
cd "$root" || exit 2
if [ -z "${NCCL_ROOT:-}" ]; then
  NCCL_ROOT=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])' 2>/dev/null || true)
fi
[ -n "$NCCL_ROOT" ] && export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
new_bin="$root/build-gpu/linac"
read -r -a bases <<<"${AB_BASE:-}"
[ -x "$new_bin" ] || { echo "ab_compare.sh: $new_bin is not built (run scripts/gpu_check.sh first)" >&2; exit 2; }
[ "${#bases[@]}" -gt 0 ] || { echo "ab_compare.sh: AB_BASE is empty (see the usage above)" >&2; exit 2; }
for base in "${bases[@]}"; do
  [ -f "$base/CMakeLists.txt" ] || { echo "ab_compare.sh: AB_BASE: '$base' is not a source tree" >&2; exit 2; }
done
jobs=$(((${GPU_CHECK_JOBS:-16} + ${#bases[@]} - 1) / ${#bases[@]}))
base_bins=() labels=() logs=() pids=()
for base in "${bases[@]}"; do
  base_bins+=("$(cd "$base" && pwd)/build-gpu/linac")
  if [ "${#bases[@]}" -eq 1 ]; then
    labels+=(baseline) logs+=("$out/ab_base_build.log")
  else
    labels+=("baseline $(basename "$base")") logs+=("$out/ab_build_$(basename "$base").log")
  fi
  (cd "$base" && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    ${NCCL_ROOT:+-DNCCL_ROOT=$NCCL_ROOT} && ninja -C build-gpu -j"$jobs" linac) >"${logs[-1]}" 2>&1 &
  pids+=($!)
done
if [ -n "${AB_TESTS:-}" ]; then
  LINAC_BIN="$new_bin" ./build-gpu/linac_gpu_tests --gtest_brief=1 --gtest_filter="$AB_TESTS" >"$out/ab_tests.log" 2>&1
  echo "tests ($AB_TESTS) rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' "$out/ab_tests.log" | tr '\n' ' ')"
  grep -E -A1 '^\[  FAILED|Failure|Expected|Which is|Google Test trace' "$out/ab_tests.log" | head -40
fi
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "ab_compare.sh: the build of ${bases[$i]} failed"; tail -20 "${logs[$i]}"; exit 1; }
done

# ab PATTERN ARGS...: `linac bench ARGS` through scripts/ab.sh, the variants only saying which
# binary runs, this tree's first in every round and the baselines after in AB_BASE's order.
variants=("LINAC=$new_bin")
for b in "${base_bins[@]}"; do variants+=("LINAC=$b"); done
ab() {
  local pattern=$1
  shift
  # shellcheck disable=SC2016  # $LINAC and $@ are the inner shell's
  scripts/ab.sh --rounds "${AB_ROUNDS:-3}" --grep "$pattern" "${variants[@]}" -- \
    bash -c '"$LINAC" bench "$@"' _ "$@"
}
: >"$out/ab.log"
for cfg in ${AB_CONFIGS:-}; do
  echo "== $cfg" | tee -a "$out/ab.log"
  ab '^ +2048 ' "$cfg" --seq-lens 2048 --micro-tokens 32768 --tokens-per-step 32768 --steps 10 >"$out/ab_runs.txt"
  cat "$out/ab_runs.txt"
  # A bench line after ' : ' is T, B, micro-batches, tokens per step, ms per step, ...
  # Runs go this tree, then each baseline, round after round.
  awk -F' : ' -v sides="$(IFS='|'; echo "this tree|${labels[*]}")" \
    'BEGIN { nv = split(sides, name, "|") }
     { line = $2; sub(/^ +/, "", line); split(line, f, / +/); k = (NR - 1) % nv + 1; s[k] += f[5]; n[k]++ }
     END { for (k = 1; k <= nv; k++) if (n[k]) printf "  %s: %.2f ms per step (mean of %d)\n", name[k], s[k] / n[k], n[k] }' \
    "$out/ab_runs.txt"
done 2>&1 | tee -a "$out/ab.log"
IFS=';' read -r -a ops <<<"${AB_OPS:-}"
for op in "${ops[@]}"; do
  [ -n "${op// /}" ] || continue
  # ab.sh keeps one line per run, so an op's --seq-lens list runs as one entry per T.
  read -r -a words <<<"$op"
  at=-1
  for i in "${!words[@]}"; do [ "${words[$i]}" = --seq-lens ] && at=$((i + 1)); done
  lens=(all)
  [ "$at" -ge 0 ] && IFS=',' read -r -a lens <<<"${words[$at]:-}"
  for t in "${lens[@]}"; do
    [ "$at" -ge 0 ] && words[at]=$t
    echo "== ${words[*]}"
    ab '^ +[0-9]+ +[0-9]+ ' "${words[@]}"
  done
done 2>&1 | tee -a "$out/ab.log"
