#!/usr/bin/env bash
# Runs every test: lint, unit and property tests, and the cluster tests on a real
# kube-apiserver/etcd/kube-scheduler with KWOK nodes. Installs what it needs first.
# Extra arguments go to pytest (e.g. e2e/test.sh -m "not cluster").
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
"$repo/e2e/setup.sh" >/dev/null
export PATH="$repo/.venv/bin:$PATH"

echo "== ruff"
ruff check operator tests bench workload
echo "== pytest"
set +e
python -m pytest "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit $status
