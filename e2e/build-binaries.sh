#!/usr/bin/env bash
# Builds, once, every binary the local KWOK cluster and the chart checks need, from the
# Go module proxy with this machine's Go toolchain, into ~/.cache/tidal/bin/<versions>/.
# Prints that directory as its last line. A second run with the same versions is a no-op.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache_root=${TIDAL_CACHE:-$HOME/.cache/tidal}
key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
bin_dir="$cache_root/bin/$key"
wanted=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kwok kwokctl helm)

all_present() {
  for b in "${wanted[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done
}
if all_present; then
  echo "$bin_dir"
  exit 0
fi

mkdir -p "$bin_dir" "$cache_root/build"
export GOMODCACHE="$cache_root/gomod"
export GOCACHE="$cache_root/gobuild"
export GOFLAGS="-buildvcs=false -mod=mod"
export CGO_ENABLED=0
# A `toolchain` line in a dependency must not silently download another Go.
export GOTOOLCHAIN=local
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if (( go_minor >= 27 )); then
  # Go 1.27's encoding/json v2 default breaks how Kubernetes 1.36 serves /openapi/v2.
  export GOEXPERIMENT=nojsonv2
fi
log() { echo "[build-binaries] $*" >&2; }

build_kubernetes() {
  local mod_dir="$cache_root/build/k8s-$KUBERNETES_VERSION"
  local staging_version="v0.${KUBERNETES_VERSION#v1.}"
  mkdir -p "$mod_dir"
  log "kubernetes $KUBERNETES_VERSION (staging modules at $staging_version)"
  local k8s_gomod
  k8s_gomod=$(cd "$mod_dir" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module tidal.dev/k8s-build"
    echo
    echo "go $(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    # k8s.io/kubernetes points its staging modules at ./staging; use their published tags instead.
    for m in $(sed -n '/^replace (/,/^)/p' "$k8s_gomod" | awk '/=>/{print $1}'); do
      if (cd "$mod_dir" && go mod download "$m@$staging_version" >/dev/null 2>&1); then
        echo "replace $m => $m $staging_version"
      else
        log "  $m@$staging_version is not published; left out (not in the build graph)"
      fi
    done
  } >"$mod_dir/go.mod"
  cat >"$mod_dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$mod_dir" && go mod tidy -e >/dev/null 2>&1 || true)
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    log "  go build $cmd"
    (cd "$mod_dir" && go build -tags tools -ldflags "$ldflags" -o "$bin_dir/$cmd" "k8s.io/kubernetes/cmd/$cmd")
  done
}

build_etcd() {
  local mod_dir="$cache_root/build/etcd-$ETCD_VERSION"
  mkdir -p "$mod_dir"
  log "etcd $ETCD_VERSION"
  # go.etcd.io/etcd/server/v3 has replace directives, so `go install pkg@version` refuses it.
  cat >"$mod_dir/go.mod" <<MOD
module tidal.dev/etcd-build

go $(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
  cat >"$mod_dir/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  (cd "$mod_dir" && go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$mod_dir" && go build -tags tools -ldflags "-s -w" -o "$bin_dir/etcd" go.etcd.io/etcd/server/v3)
}

build_go_installable() {
  log "kwok $KWOK_VERSION, helm $HELM_VERSION"
  GOBIN="$bin_dir" go install -ldflags "-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
  GOBIN="$bin_dir" go install -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
}

start=$(date +%s)
[[ -x "$bin_dir/kwokctl" && -x "$bin_dir/helm" ]] || build_go_installable
[[ -x "$bin_dir/etcd" ]] || build_etcd
[[ -x "$bin_dir/kube-apiserver" && -x "$bin_dir/kubectl" && -x "$bin_dir/kube-scheduler" && -x "$bin_dir/kube-controller-manager" ]] || build_kubernetes
all_present || { log "some binaries are missing in $bin_dir"; exit 1; }
log "built in $(( $(date +%s) - start )) s"
echo "$bin_dir"
