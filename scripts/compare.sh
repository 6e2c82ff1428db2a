#!/usr/bin/env bash
# Compares the architectures on language modelling and on MQAR; tabulates and plots the results.
#
#   scripts/compare.sh [--build DIR] [--data FILE.h5] [--steps-lm N] [--steps-mqar N] [--out DIR]
#                      [--archs a,b,...] [--mixers a,b,...] [--widths 64,128]
#
# LM: each of --archs (default: transformer gla based transnormer latte latte_macchiato
#   transformer_vq) trains
#   configs/compare/<arch>_30m.json (~30M non-embedding parameters, T = 512) for --steps-lm steps
#   (default 1000, validating every tenth of them) on --data (default data/brown.h5: Brown with linac's default 8192-piece
#   tokenizer, fetched and prepared when missing) into OUT/lm/<arch>/, then saves `linac eval`
#   (eval.json), `linac info` (info.json) and `linac bench` at the config's T (bench.json).
# MQAR: each of --mixers (default: attention sliding_window based gla transnormer latte
#   latte_macchiato transformer_vq) at each of --widths trains configs/mqar/<mixer>_d<width>.json (--steps-mqar
#   steps, default: the config's) into OUT/mqar/<mixer>_d<width>/, then saves eval.json and info.json.
# Then OUT/compare.json and OUT/compare.md (scripts/compare_table.py), and, with a python3 that
# has matplotlib, OUT/lm_loss.png (scripts/plot_runs.py) and OUT/mqar.png (scripts/plot_mqar.py).
# --out defaults to runs/compare; an empty list (--archs '') skips that part. A run that fails is
# recorded (OUT/.../error.txt, "failed: <reason>" in the tables), the others go on, and the exit
# status is 1. Training resumes (--resume auto), so a rerun only finishes what is missing and
# evaluates again. Runs on the GPU when there is one (train.device auto), else on the CPU, slowly.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() { sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die() { echo "compare: error: $*" >&2; exit 2; }
say() { echo "compare: $*"; }
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

build="$root/build" data="$root/data/brown.h5" out="$root/runs/compare" steps_lm=1000 steps_mqar=""
archs="transformer,gla,based,transnormer,latte,latte_macchiato,transformer_vq"
mixers="attention,sliding_window,based,gla,transnormer,latte,latte_macchiato,transformer_vq"
widths="64,128"
while [ $# -gt 0 ]; do
  case $1 in -h | --help) usage; exit 0 ;; esac
  [ $# -ge 2 ] || die "unknown argument or missing value: $1 (see --help)"
  case $1 in
    --build) build=$(abs "$2") ;;
    --data) data=$(abs "$2") ;;
    --out) out=$(abs "$2") ;;
    --steps-lm) steps_lm=$2 ;;
    --steps-mqar) steps_mqar=$2 ;;
    --archs) archs=$2 ;;
    --mixers) mixers=$2 ;;
    --widths) widths=$2 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift 2
done
[[ $steps_lm =~ ^[1-9][0-9]*$ ]] || die "--steps-lm must be a positive integer, got '$steps_lm'"
[[ -z $steps_mqar || $steps_mqar =~ ^[1-9][0-9]*$ ]] || die "--steps-mqar must be a positive integer, got '$steps_mqar'"
[[ $widths =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--widths must be a comma-separated list of positive integers, got '$widths'"
IFS=, read -ra archs <<<"$archs"
IFS=, read -ra mixers <<<"$mixers"
IFS=, read -ra widths <<<"$widths"
linac="$build/linac"
[ -x "$linac" ] || die "$linac not found (build first: cmake --build $build)"
cd "$root"
export OMP_WAIT_POLICY=passive
mkdir -p "$out"
failures=0

jget() {  # jget FILE KEY.PATH [FORMAT]: one field of a JSON file (list indices as numbers; FORMAT as
          # Python's format()), "?" when it has none
  python3 - "$@" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
    for k in sys.argv[2].split("."):
        v = v[int(k)] if isinstance(v, list) else v[k]
    print(format(v, sys.argv[3] if len(sys.argv) > 3 else ""))
except (OSError, ValueError, LookupError, TypeError):
    print("?")
PY
}

fail() {  # fail DIR REASON: records a failed run
  printf '%s\n' "$2" >"$1/error.txt"
  echo "compare: $(basename "$1") failed: $2" >&2
  failures=$((failures + 1))
}

run() {  # run OUT CMD...: CMD's stdout to OUT, stderr to OUT.err; a failure is recorded in OUT's directory
  local out=$1 rc=0 last
  shift
  "$@" >"$out" 2>"$out.err" || rc=$?
  if [ "$rc" -eq 0 ]; then
    [ -s "$out.err" ] || rm -f "$out.err"
    return 0
  fi
  last=$(grep -v '^[[:space:]]*$' "$out.err" | tail -n 1 || true)
  fail "$(dirname "$out")" "${last:-$(basename "$1") $2: exit status $rc}"
  return 1
}

train_and_eval() {  # train_and_eval CFG DIR [--set ...]: trains CFG into DIR, then eval.json and info.json
  local cfg=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  rm -f "$dir/error.txt"
  [ -f "$cfg" ] || { fail "$dir" "no config $cfg"; return 1; }
  say "$(basename "$dir"): training $cfg (follow: tail -f $dir/train.log)"
  run "$dir/train.out" "$linac" train "$cfg" --set train.out_dir="$dir" "$@" --resume auto || return 1
  [ -s "$dir/ckpt/latest" ] || { fail "$dir" "no checkpoint in $dir/ckpt after training"; return 1; }
  run "$dir/eval.json" "$linac" eval --checkpoint "$dir/ckpt/$(cat "$dir/ckpt/latest")" --json || return 1
  run "$dir/info.json" "$linac" info "$cfg" --json
}

if [ ${#archs[@]} -gt 0 ] && [ ! -f "$data" ]; then
  say "$data missing: fetching Brown and tokenising it (8192-piece BPE), as in scripts/quickstart.sh"
  bash scripts/get_corpus.sh brown || die "could not fetch the Brown corpus"
  mkdir -p "$(dirname "$data")"
  "$linac" prepare --input "${LINAC_DATA_DIR:-$root/data}/brown" --out "$data" --val-fraction 0.02 || die "could not prepare $data"
fi

lm_plotted=()
for arch in "${archs[@]}"; do
  dir="$out/lm/$arch" start=$SECONDS
  cfg="configs/compare/${arch}_30m.json"
  # Ten validation points per run whatever the budget, for the loss curves.
  train_and_eval "$cfg" "$dir" --set data.path="$data" --set train.steps="$steps_lm" \
    --set train.eval_every=$(( (steps_lm + 9) / 10 )) || continue
  lm_plotted+=("$dir")
  run "$dir/bench.json" "$linac" bench "$cfg" --seq-lens "$(jget "$cfg" data.seq_len)" --steps 5 --json || continue
  say "$arch: done in $((SECONDS - start)) s: val loss $(jget "$dir/eval.json" loss .4f), $(jget "$dir/bench.json" rows.0.tokens_per_s ,.0f) tokens/s"
done

mqar_done=0
for mixer in "${mixers[@]}"; do
  for width in "${widths[@]}"; do
    dir="$out/mqar/${mixer}_d$width" start=$SECONDS
    train_and_eval "configs/mqar/${mixer}_d$width.json" "$dir" ${steps_mqar:+--set train.steps="$steps_mqar"} || continue
    mqar_done=$((mqar_done + 1))
    say "${mixer}_d$width: done in $((SECONDS - start)) s: MQAR accuracy $(jget "$dir/eval.json" mqar.accuracy .3f) (pooled)"
  done
done

python3 scripts/compare_table.py "$out" || failures=$((failures + 1))
plot_py=""
for py in python3 /usr/bin/python3; do
  if "$py" -c 'import matplotlib' 2>/dev/null; then plot_py=$py; break; fi
done
if [ -z "$plot_py" ]; then
  say "no python3 with matplotlib: plots skipped (Debian: apt-get install python3-matplotlib)"
else
  if [ ${#lm_plotted[@]} -gt 0 ]; then
    "$plot_py" scripts/plot_runs.py "${lm_plotted[@]}" --out "$out/lm_loss.png" --train-loss \
      --title "~30M non-embedding parameters, $(basename "$data"), T = 512" || failures=$((failures + 1))
  fi
  if [ "$mqar_done" -gt 0 ]; then
    "$plot_py" scripts/plot_mqar.py "$out/compare.json" --out "$out/mqar.png" || failures=$((failures + 1))
  fi
fi
say "tables: $out/compare.md, $out/compare.json"
if [ "$failures" -gt 0 ]; then
  say "$failures failure(s): see the messages above and the error.txt files under $out"
  exit 1
fi
