#!/usr/bin/env bash
# Soak test (not in CI): 2,000 CPU steps of a tiny model with a checkpoint and an eval every 20
# steps, keep_last 3. Samples the trainer's resident memory and open file descriptors while it
# runs and prints them; fails (exit 1) when either grows over the run, or when the run directory
# holds anything but the kept checkpoints, `latest`, the lock, config, log and metrics.
#   scripts/soak.sh [LINAC_BIN]        (default build/linac; STEPS overrides 2000)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$(realpath "${1:-$root/build/linac}")"
steps="${STEPS:-2000}"
work="$(mktemp -d /tmp/linac_soak.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=passive

mkdir -p "$work/text"
python3 - "$work/text/corpus.txt" <<'PY'
import random, sys
random.seed(3)
nouns = "city river king army church school market road village house ship forest".split()
verbs = "built crossed ruled defended founded opened followed reached governed entered".split()
with open(sys.argv[1], "w") as f:
    for d in range(800):
        for s in range(5):
            f.write(f"The {random.choice(nouns)} {random.choice(verbs)} the {random.choice(nouns)} in {1000 + random.randrange(900)}. ")
        f.write("\n\n")
PY
"$bin" prepare --input "$work/text" --out "$work/tiny.h5" --vocab-size 300 --quiet >/dev/null
cat >"$work/cfg.json" <<JSON
{"model": {"arch": "transformer", "n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 300, "ffn_hidden": 64},
 "data": {"path": "$work/tiny.h5", "seq_len": 32},
 "train": {"steps": $steps, "global_batch_tokens": 256, "micro_batch": 4, "lr": 3e-3, "min_lr": 3e-4,
           "warmup_steps": 20, "eval_every": 20, "eval_tokens": 2000, "log_every": 20, "checkpoint_every": 20,
           "keep_last": 3, "device": "cpu", "precision": "fp32", "threads": 1, "out_dir": "$work/run"}}
JSON

"$bin" train "$work/cfg.json" >"$work/train.out" 2>&1 &
pid=$!
samples="$work/samples.txt"
t0=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
  # (the trainer may exit between two reads: every read is allowed to fail)
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  fds=$( (ls "/proc/$pid/fd" 2>/dev/null || true) | wc -l)
  step=$( (tail -n 1 "$work/run/metrics.jsonl" 2>/dev/null || true) | sed -n 's/.*"step":\([0-9]*\).*/\1/p')
  [ -n "$rss" ] && echo "$(( $(date +%s) - t0 )) ${step:-0} $rss $fds" >>"$samples"
  sleep 1
done
wait "$pid" || { echo "soak: training failed:"; tail -5 "$work/train.out"; exit 1; }

echo "seconds step rss_kib open_fds"
awk 'NR % 5 == 1' "$samples"
tail -n 1 "$samples"
status=0
# Flat: compare the second half of the run with the samples just after the first checkpoints.
n=$(wc -l <"$samples")
if [ "$n" -lt 6 ]; then echo "soak: too few samples ($n) to judge"; exit 1; fi
read -r rss_early fds_early < <(awk -v n="$n" 'NR > n / 10 && NR <= n / 5 + 1 {r = r > $3 ? r : $3; f = f > $4 ? f : $4} END {print r, f}' "$samples")
read -r rss_late fds_late < <(awk -v n="$n" 'NR > n / 2 {r = r > $3 ? r : $3; f = f > $4 ? f : $4} END {print r, f}' "$samples")
echo "peak RSS early $rss_early KiB, late $rss_late KiB; peak open fds early $fds_early, late $fds_late"
if [ "$rss_late" -gt $(( rss_early + rss_early / 20 + 2048 )) ]; then echo "soak: FAIL resident memory grew"; status=1; fi
if [ "$fds_late" -gt "$fds_early" ]; then echo "soak: FAIL open file descriptors grew"; status=1; fi
left=$(cd "$work/run" && find . -type f | sort | tr '\n' ' ')
want=$(printf '%s\n' ./.lock ./ckpt/latest ./config.json ./metrics.jsonl ./train.log \
  "./ckpt/step_$(printf %06d $((steps - 40))).h5" "./ckpt/step_$(printf %06d $((steps - 20))).h5" \
  "./ckpt/step_$(printf %06d "$steps").h5" | sort | tr '\n' ' ')
echo "run directory: $left"
if [ "$left" != "$want" ]; then echo "soak: FAIL expected exactly: $want"; status=1; fi
[ $status -eq 0 ] && echo "soak: PASS ($steps steps in $(( $(date +%s) - t0 )) s)"
exit $status
