#!/usr/bin/env bash
# The same flow on kind, for users with a Docker engine (not run in CI: it has none).
# kind nodes have no GPUs, so this advertises fake nvidia.com/gpu capacity on the workers through
# the node status (as KWOK does) and labels them like one NVL72-style supernode per worker.
#   e2e/kind.sh up     # kind cluster "tidal" with 4 workers, CRDs, Supernodes
#   e2e/kind.sh down
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
name=${TIDAL_KIND_NAME:-tidal}
case "${1:-up}" in
  up)
    cat <<YAML | kind create cluster --name "$name" --config -
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
- role: worker
- role: worker
- role: worker
- role: worker
YAML
    i=0
    for node in $(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
      sn="kind-sn-$((i / 2))"
      kubectl label "$node" tidal.dev/supernode="$sn" tidal.dev/block=kind-block-0 --overwrite
      kubectl patch "$node" --subresource=status --type=merge \
        -p '{"status":{"capacity":{"nvidia.com/gpu":"4"},"allocatable":{"nvidia.com/gpu":"4"}}}'
      i=$((i + 1))
    done
    kubectl apply --server-side -f "$repo/crds"
    kubectl wait --for=condition=Established --timeout=60s -f "$repo/crds"
    kubectl apply -f "$repo/examples/peering.yaml" -f "$repo/examples/priorityclasses.yaml"
    echo "now: tidal run --discover-supernodes tidal.dev/supernode   (then apply your TrainingJobs)"
    ;;
  down) kind delete cluster --name "$name" ;;
  *) echo "usage: e2e/kind.sh up|down" >&2; exit 2 ;;
esac
