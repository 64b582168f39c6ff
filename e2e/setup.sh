#!/usr/bin/env bash
# Installs everything tidal's tests and demo need, idempotently:
#   - a virtualenv at .venv with tidal and its test/dev extras (PyPI)
#   - kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd, kwok, kwokctl, helm
#     built from the Go module proxy into ~/.cache/tidal/bin/<versions> (e2e/build-binaries.sh)
#   - promtool and prometheus (Debian package `prometheus`)
# Prints the binaries' directory as its last line.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "[setup] $*" >&2; }

venv="$repo/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
  log "creating $venv"
  python3 -m venv "$venv"
fi
stamp="$venv/.tidal-installed"
if [[ ! -f "$stamp" || "$repo/pyproject.toml" -nt "$stamp" || "$repo/workload/pyproject.toml" -nt "$stamp" ]]; then
  log "installing tidal[dev] and the workload library (tidal-workload) into $venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet -e "$repo[dev]" -e "$repo/workload" >&2
  touch "$stamp"
fi

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing prometheus and promtool (Debian package)"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2
  else
    log "promtool not found and cannot apt-get install it: the alert-rule tests will fail"
  fi
fi

"$repo/e2e/build-binaries.sh"
