#!/usr/bin/env bash
# A/B of environment settings on one machine in one call: COMMAND runs once per variant in each
# round, the variants alternating, so that a slow stretch of the GPU (clocks, a neighbour) falls on
# every variant alike. Each run prints one line: the last line of its output that matches --grep
# (default: its last line).
#   scripts/ab.sh [--rounds N] [--grep REGEX] VARIANT... -- COMMAND [ARGS...]
# A VARIANT is a space-separated list of NAME=VALUE settings, or "-" for the environment as it is:
#   scripts/ab.sh --rounds 2 --grep '^ +2048 ' - "LINAC_ATTENTION_KERNELS=sm80" -- \
#     build-gpu/linac bench configs/latte_macchiato_153m.json --seq-lens 2048 --steps 10
# prints
#   round 1  -                              :     2048     16 ...  79.48 ...
#   round 1  LINAC_ATTENTION_KERNELS=sm80   :     2048     16 ...  84.16 ...
#   round 2  ...
# Exit status: 2 for bad usage (one line on stderr), 1 if a run failed (its line says so), else 0.
set -uo pipefail

usage() {
  echo "ab.sh: $1 (usage: scripts/ab.sh [--rounds N] [--grep REGEX] VARIANT... -- COMMAND [ARGS...])" >&2
  exit 2
}

rounds=2
pattern=""
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds)
      [ $# -ge 2 ] || usage "--rounds needs a value"
      [[ "$2" =~ ^[1-9][0-9]*$ ]] || usage "--rounds must be a positive integer, got '$2'"
      rounds=$2
      shift 2 ;;
    --grep)
      [ $# -ge 2 ] || usage "--grep needs a value"
      pattern=$2
      shift 2 ;;
    --)
      shift
      break ;;
    *)
      variants+=("$1")
      shift ;;
  esac
done
[ ${#variants[@]} -ge 1 ] || usage "no variant given"
[ $# -ge 1 ] || usage "no command after --"
for v in "${variants[@]}"; do
  [ "$v" = "-" ] && continue
  for kv in $v; do
    [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || usage "variant '$v': '$kv' is not NAME=VALUE"
  done
done

width=1
for v in "${variants[@]}"; do ((${#v} > width)) && width=${#v}; done
failed=0
for ((r = 1; r <= rounds; r++)); do
  for v in "${variants[@]}"; do
    settings=()
    [ "$v" = "-" ] || read -r -a settings <<<"$v"
    output=$(env ${settings[@]+"${settings[@]}"} "$@" 2>&1)
    rc=$?
    if [ -n "$pattern" ]; then
      line=$(grep -E -- "$pattern" <<<"$output" | tail -1)
    else
      line=$(tail -1 <<<"$output")
    fi
    if [ $rc -ne 0 ]; then
      failed=1
      line="exit status $rc: ${line:-no output}"
    elif [ -z "$line" ]; then
      line="no line matched"
    fi
    printf 'round %d  %-*s : %s\n' "$r" "$width" "$v" "$line"
  done
done
exit $failed
