#!/usr/bin/env bash
# The main job, on one machine with no Docker: build what is needed, bring up a local cluster
# (real kube-apiserver, etcd, kube-scheduler, kube-controller-manager; KWOK GPU nodes: three
# NVL72 racks, three CloudMatrix384-like domains, three 8-GPU servers), install the CRDs, start
# the operator, apply the examples, and print where every HBD group landed.
# It leaves everything running; `e2e/demo.sh down` removes it all.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export TIDAL_CLUSTER_NAME=${TIDAL_CLUSTER_NAME:-tidal}
state="${TIDAL_DEMO_HOME:-$HOME/.cache/tidal/demo}"
mkdir -p "$state"
log() { echo "[demo] $*" >&2; }

stop_operator() {
  if [[ -f "$state/operator.pid" ]]; then
    kill "$(cat "$state/operator.pid")" 2>/dev/null || true
    rm -f "$state/operator.pid"
  fi
}

if [[ "${1:-}" == "down" ]]; then
  stop_operator
  "$repo/e2e/cluster.sh" down
  exit 0
fi

bin=$("$repo/e2e/setup.sh" | tail -n 1)
export PATH="$repo/.venv/bin:$bin:$PATH"
export TIDAL_PYTHON="$repo/.venv/bin/python"
eval "$("$repo/e2e/cluster.sh" up --shape mixed --supernodes 9 | tail -n 1)"

log "installing the CRDs and the sample Supernodes"
kubectl apply --server-side --force-conflicts -f "$repo/crds" >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f "$repo/crds" >/dev/null
kubectl apply -f "$repo/examples/peering.yaml" -f "$repo/examples/supernodes.yaml" >/dev/null

stop_operator
log "starting the operator (logs: $state/operator.log)"
nohup tidal run --health-port 0 >"$state/operator.log" 2>&1 &
echo $! >"$state/operator.pid"

log "applying the sample workloads"
kubectl apply -f "$repo/examples/priorityclasses.yaml" >/dev/null  # the workloads name them
kubectl apply -f "$repo/examples/workloads/" >/dev/null
deadline=$(( $(date +%s) + 180 ))
until [[ -z "$(kubectl get trainingjobs -A --no-headers 2>/dev/null | awk '$3 != "Running"')" ]]; do
  if (( $(date +%s) > deadline )); then log "not every job is Running yet; see below"; break; fi
  sleep 2
done

echo
tidal placement
echo
cat <<MSG
The cluster and the operator keep running. Try:
  export KUBECONFIG=$KUBECONFIG
  export PATH=$repo/.venv/bin:$bin:\$PATH
  kubectl get supernodes
  kubectl get trainingjobs -A
  kubectl describe trainingjob moe-pretrain
  tidal placement
Tear it all down with:
  e2e/demo.sh down
MSG
