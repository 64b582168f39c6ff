#!/usr/bin/env bash
# A real local Kubernetes for tests and the demo: kube-apiserver (RBAC on), etcd,
# kube-controller-manager, kube-scheduler and KWOK (simulated GPU nodes) on 127.0.0.1,
# run by `kwokctl --runtime binary` from binaries built by e2e/build-binaries.sh. No downloads.
#
#   e2e/cluster.sh up [--name N] [--shape nvl72|cm384|hgx8|mixed] [--supernodes N]
#                     [--nodes-per-supernode M] [--gpus-per-node G]
#   e2e/cluster.sh down [--name N]
#   e2e/cluster.sh status [--name N]
#   e2e/cluster.sh kubeconfig [--name N]
#
# `up` prints `export KUBECONFIG=<path>` as its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

cmd=${1:-}; shift || true
name=${TIDAL_CLUSTER_NAME:-tidal}
shape=nvl72 supernodes=8 nodes_per=""; gpus_per=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --supernodes) supernodes=$2; shift 2 ;;
    --nodes-per-supernode) nodes_per=$2; shift 2 ;;
    --gpus-per-node) gpus_per=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

export KWOK_WORKDIR=${TIDAL_CLUSTER_HOME:-$HOME/.cache/tidal/clusters}
cluster_dir="$KWOK_WORKDIR/clusters/$name"
kubeconfig="$cluster_dir/tidal.kubeconfig"
log() { echo "[cluster] $*" >&2; }
# Nodes and pods annotated <this>=true are left alone by KWOK (tests/cluster/test_fencing.py).
KWOK_IGNORE_ANNOTATION=test.tidal.dev/kwok-ignore

binaries() { "$here/build-binaries.sh" | tail -n 1; }

python_bin() {  # the repo's virtualenv (e2e/setup.sh makes it) when there is one
  if [[ -x "${TIDAL_PYTHON:-}" ]]; then echo "$TIDAL_PYTHON"
  elif [[ -x "$repo/.venv/bin/python" ]]; then echo "$repo/.venv/bin/python"
  else command -v python3; fi
}

need_tidal_deps() {
  if ! "$(python_bin)" -c "import pydantic, structlog, yaml" 2>/dev/null; then
    log "tidal's Python dependencies are missing for $(python_bin): run e2e/setup.sh first (it makes .venv)"
    exit 1
  fi
}

ready() {
  [[ -f "$kubeconfig" ]] && "$bin/kubectl" --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1
}

free_ports() {  # free_ports <n>: n free TCP ports on 127.0.0.1
  "$(python_bin)" - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

wait_for() {  # wait_for <seconds> <description> <command...>
  local deadline=$(( $(date +%s) + $1 )) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if (( $(date +%s) > deadline )); then log "timed out waiting for $what"; return 1; fi
    sleep 1
  done
}

nodes_settled() {
  # Every node Ready and free of the not-ready/unreachable taints the node lifecycle controller adds.
  local out
  out=$("$bin/kubectl" --kubeconfig "$kubeconfig" get nodes --no-headers \
    -o 'custom-columns=R:.status.conditions[?(@.type=="Ready")].status,T:.spec.taints[*].key')
  [[ -n "$out" ]] && ! grep -qvE '^True +<none>$' <<<"$out"
}

up() {
  need_tidal_deps
  bin=$(binaries)
  local start; start=$(date +%s)
  if ready; then
    log "cluster $name is already up"
  else
    "$bin/kwokctl" delete cluster --name "$name" >/dev/null 2>&1 || true
    mkdir -p "$KWOK_WORKDIR"
    local config="$KWOK_WORKDIR/$name.kwok.yaml" etcd_port peer_port kwok_port
    read -r etcd_port peer_port kwok_port < <(free_ports 3)
    # kwokctl binds etcd and kwok-controller to 0.0.0.0; keep every component on loopback.
    cat >"$config" <<YAML
kind: KwokctlConfiguration
apiVersion: config.kwok.x-k8s.io/v1alpha1
componentsPatches:
- name: etcd
  extraArgs:
  - {key: listen-client-urls, value: "http://127.0.0.1:$etcd_port"}
  - {key: advertise-client-urls, value: "http://127.0.0.1:$etcd_port"}
  - {key: listen-peer-urls, value: "http://127.0.0.1:$peer_port"}
  - {key: initial-advertise-peer-urls, value: "http://127.0.0.1:$peer_port"}
  - {key: initial-cluster, value: "node0=http://127.0.0.1:$peer_port"}
- name: kwok-controller
  extraArgs:
  - {key: server-address, value: "127.0.0.1:$kwok_port"}
  # A per-object opt-out, so a test can cut a node off as a real partition would: KWOK leaves
  # nodes and pods with this annotation alone (no heartbeat, nothing confirms a deletion).
  # Deprecated in KWOK for the Stage API, still honoured by the pinned v0.8.0.
  - {key: disregard-status-with-annotation-selector, value: "$KWOK_IGNORE_ANNOTATION=true"}
- name: kube-apiserver
  extraArgs:
  - {key: bind-address, value: 127.0.0.1}
- name: kube-controller-manager
  extraArgs:
  - {key: bind-address, value: 127.0.0.1}
  - {key: kube-api-qps, value: "200"}
  - {key: kube-api-burst, value: "400"}
- name: kube-scheduler
  extraArgs:
  - {key: bind-address, value: 127.0.0.1}
  - {key: kube-api-qps, value: "500"}
  - {key: kube-api-burst, value: "1000"}
YAML
    # The API server's audit log records who deleted each pod and with which grace period: how
    # tests/cluster/test_node_loss.py tells the operator's forced delete from the pod GC's.
    cat >"$KWOK_WORKDIR/$name.audit.yaml" <<YAML
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [delete]
  resources: [{group: "", resources: [pods]}]
- level: None
YAML
    log "starting cluster $name (kwokctl --runtime binary, RBAC on)"
    "$bin/kwokctl" create cluster --name "$name" --runtime binary --config "$config" \
      --kube-authorization=true \
      --kube-audit-policy "$KWOK_WORKDIR/$name.audit.yaml" \
      --kube-apiserver-binary "$bin/kube-apiserver" \
      --kube-controller-manager-binary "$bin/kube-controller-manager" \
      --kube-scheduler-binary "$bin/kube-scheduler" \
      --etcd-binary "$bin/etcd" \
      --kwok-controller-binary "$bin/kwok" \
      --etcd-port "$etcd_port" --controller-port "$kwok_port" \
      --kubeconfig "$kubeconfig" --timeout 5m >"$KWOK_WORKDIR/$name.create.log" 2>&1 \
      || { tail -20 "$KWOK_WORKDIR/$name.create.log" >&2; exit 1; }
    wait_for 120 "the API server" ready
  fi
  local k=("$bin/kubectl" --kubeconfig "$kubeconfig")
  local args=(fleet --shape "$shape" --supernodes "$supernodes")
  [[ -n "$nodes_per" ]] && args+=(--nodes-per-supernode "$nodes_per")
  [[ -n "$gpus_per" ]] && args+=(--gpus-per-node "$gpus_per")
  PYTHONPATH="$repo/operator${PYTHONPATH:+:$PYTHONPATH}" "$(python_bin)" -m tidal "${args[@]}" >"$cluster_dir/nodes.yaml"
  local count; count=$(grep -c '^kind: Node' "$cluster_dir/nodes.yaml")
  log "creating $count simulated GPU nodes ($shape, $supernodes supernodes)"
  "${k[@]}" apply --server-side --force-conflicts -f "$cluster_dir/nodes.yaml" >/dev/null
  wait_for 300 "$count nodes to be Ready and untainted" nodes_settled
  wait_for 120 "the default ServiceAccount" "${k[@]}" get serviceaccount default -n default
  log "cluster $name up with $count nodes in $(( $(date +%s) - start )) s"
  echo "export KUBECONFIG=$kubeconfig"
}

down() {
  bin=$(binaries)
  "$bin/kwokctl" delete cluster --name "$name" >/dev/null 2>&1 || true
  # kwokctl stops the components it started; make sure nothing of this cluster is left behind.
  pkill -f "$KWOK_WORKDIR/clusters/$name/" 2>/dev/null || true
  rm -rf "$cluster_dir" "$KWOK_WORKDIR/$name.kwok.yaml" "$KWOK_WORKDIR/$name.create.log" "$KWOK_WORKDIR/$name.audit.yaml"
  log "cluster $name removed"
}

status() {
  bin=$(binaries)
  if ready; then
    local nodes; nodes=$("$bin/kubectl" --kubeconfig "$kubeconfig" get nodes --no-headers 2>/dev/null | wc -l)
    echo "cluster $name: up, $nodes nodes, KUBECONFIG=$kubeconfig"
  else
    echo "cluster $name: down"
    return 1
  fi
}

case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  kubeconfig) echo "$kubeconfig" ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
