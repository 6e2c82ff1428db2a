#!/usr/bin/env bash
# Multi-node `linac train` with Open MPI's mpirun and a hostfile, for hosts without Slurm: one rank
# per GPU, the ranks filled host by host.
#
#   scripts/mpirun_hosts.sh HOSTFILE CONFIG.json [--set key.path=value]...
#   LINAC_DRY_RUN=1 scripts/mpirun_hosts.sh hosts.txt configs/transformer_1.3b.json
#
# HOSTFILE: one host per line with its GPU count as slots ('#' starts a comment):
#   gpu01 slots=8
#   gpu02 slots=8
# Rank -> GPU: mpirun fills gpu01's slots with ranks 0-7, then gpu02's with 8-15; linac picks GPU
# OMPI_COMM_WORLD_LOCAL_RANK % device_count, so slots must not exceed a host's GPUs.
#
# It always runs `linac train CONFIG --resume auto`: rerun the same command after a stop or a
# crash and it continues from the newest intact checkpoint in train.out_dir, which must be on a
# file system every host sees. The launching host needs passwordless ssh to every host, and every
# host the same linac build at the same path.
#
# Stopping with a checkpoint: send SIGTERM to one linac process on any host (kill -TERM PID); the
# ranks agree on the stop after every step, so all of them checkpoint and exit 0 after the same
# step. SIGINT or SIGTERM to mpirun itself makes it TERM the ranks and SIGKILL them a few seconds
# later, possibly before the checkpoint is written (the previous intact one is then resumed).
#
# Environment:
#   LINAC           linac binary, the same path on every host (default: build/linac of this repository)
#   LINAC_DRY_RUN=1 print the exports and the mpirun line, then exit 0 without launching
#   NCCL_*          every exported NCCL_ variable is forwarded with -x (mpirun forwards nothing
#                   it is not told to); NCCL_NVLS_ENABLE defaults to 0. NCCL_SOCKET_IFNAME,
#                   NCCL_IB_HCA, NCCL_IB_DISABLE, NCCL_DEBUG: see docs/scaling.md.
#   OMPI_MCA_*      Open MPI's own settings, read by mpirun (e.g. OMPI_MCA_btl_tcp_if_include=ib0
#                   and OMPI_MCA_oob_tcp_if_include=ib0 when hosts have several interfaces).
set -euo pipefail

die() {
  echo "mpirun_hosts.sh: error: $*" >&2
  exit 2
}
# A word as a shell reads it back: bare when it has no special characters, else single-quoted.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./^-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
linac="${LINAC:-$root/build/linac}"
dry_run="${LINAC_DRY_RUN:-0}"
case "$dry_run" in 0 | 1) ;; *) die "LINAC_DRY_RUN must be 0 or 1, got '$dry_run'" ;; esac

[ $# -ge 2 ] || die "usage: scripts/mpirun_hosts.sh HOSTFILE CONFIG.json [--set key.path=value]..."
hostfile="$1"
config="$2"
shift 2
[ -f "$hostfile" ] || die "hostfile '$hostfile' not found"
[ -f "$config" ] || die "config '$config' not found (relative paths start at $PWD)"
for a in "$@"; do
  case "$a" in --resume | --resume=*) die "drop '$a': this script always passes --resume auto" ;; esac
done

# Without slots= mpirun counts a host's CPU cores as its slots, which would start a rank per core.
hosts=()
ranks=0
n=0
while IFS= read -r raw || [ -n "$raw" ]; do
  n=$((n + 1))
  read -r -a words <<<"${raw%%#*}"
  [ "${#words[@]}" -gt 0 ] || continue
  slots=""
  for w in "${words[@]:1}"; do
    case "$w" in slots=*) slots="${w#slots=}" ;; esac
  done
  [[ "$slots" =~ ^[1-9][0-9]*$ ]] || die "$hostfile:$n: give each host its GPU count as slots=N, got '${raw}'"
  hosts+=("${words[0]}")
  ranks=$((ranks + slots))
done <"$hostfile"
[ "$ranks" -gt 0 ] || die "$hostfile names no host"
if [ "$dry_run" = 0 ]; then
  command -v mpirun >/dev/null || die "mpirun not found (install Open MPI)"
  [ -x "$linac" ] || die "linac binary '$linac' not found or not executable (set LINAC)"
fi

# NVLink SHARP (NVLS) needs NVSwitch multicast, which shared and virtualised GPU machines often do
# not allow; linac's scripts and tests keep it off. Export NCCL_NVLS_ENABLE=1 where it works.
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
mapfile -t forward < <(compgen -e | grep '^NCCL_' | sort)

# --bind-to none: a rank bound to one core would share it with NCCL's proxy threads.
launch=(mpirun -np "$ranks" --hostfile "$hostfile" --map-by slot --bind-to none)
for v in "${forward[@]}" LD_LIBRARY_PATH; do
  if [ -n "${!v+set}" ]; then launch+=(-x "$v"); fi
done
launch+=("$linac" train "$config" --resume auto "$@")

echo "# linac: $ranks ranks, one GPU each, on hosts ${hosts[*]}"
for v in "${forward[@]}"; do echo "export $v=$(quote "${!v}")"; done
line=""
for w in "${launch[@]}"; do line+=" $(quote "$w")"; done
echo "${line# }"
[ "$dry_run" = 0 ] || exit 0
exec "${launch[@]}"
