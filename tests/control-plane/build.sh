#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kubectl and etcd from the Go module proxy, once per version, into a cache
# outside the repo. Prints the cache directory on stdout (last line); progress goes to stderr.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every staging module with
# ./staging/... at v0.0.0. A throwaway wrapper module requires it and points each staging module at
# its published v0.<minor>.<patch> instead. etcd gets a wrapper of its own so its dependency
# versions never mix with Kubernetes'.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${BRIQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/briq-operator}"
OUT="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"

log() { printf '[control-plane build] %s\n' "$*" >&2; }

if [[ -x "$OUT/bin/kube-apiserver" && -x "$OUT/bin/kube-controller-manager" && -x "$OUT/bin/kubectl" &&
  -x "$OUT/bin/etcd" ]]; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null || { log "go is required (Go >= 1.24)"; exit 1; }
mkdir -p "$OUT/bin"
work=$(mktemp -d "$CACHE_ROOT/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
start=$(date +%s)

build_kubernetes() {
  local dir="$work/k8s" minor patch kk_mod
  mkdir -p "$dir"
  minor=$(cut -d. -f2 <<<"${K8S_VERSION#v}")
  patch=$(cut -d. -f3 <<<"${K8S_VERSION#v}")
  kk_mod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
  [[ -f "$kk_mod" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION"; return 1; }
  {
    echo "module briq.cloud/control-plane-build"
    grep -E '^go [0-9]' "$kk_mod"
    grep -E '^godebug ' "$kk_mod" || true
    echo "require k8s.io/kubernetes $K8S_VERSION"
    # Every staging module k/k replaces with ./staging/src/k8s.io/<m>, pointed at its release.
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/[a-z0-9-]*$#\1#p' "$kk_mod" |
      while read -r m; do echo "replace $m => $m v0.$minor.$patch"; done
  } >"$dir/go.mod"
  # go.mod may carry a `godebug (...)` block; keep it when present.
  if grep -q '^godebug ($' "$kk_mod"; then
    sed -n '/^godebug ($/,/^)$/p' "$kk_mod" >>"$dir/go.mod"
  fi
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  log "resolving Kubernetes $K8S_VERSION modules ($(grep -c '^replace' "$dir/go.mod") staging replaces)"
  (cd "$dir" && go mod tidy -e >&2)
  local pkg=k8s.io/component-base/version cgo=k8s.io/client-go/pkg/version now ld=""
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for p in $pkg $cgo; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$now"
  done
  log "building kube-apiserver, kube-controller-manager and kubectl (this takes a while on a cold cache)"
  (cd "$dir" && go build -trimpath -tags grpcnotrace -ldflags "-s -w $ld" \
    -o "$OUT/bin/" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl >&2)
}

build_etcd() {
  local dir="$work/etcd"
  mkdir -p "$dir"
  printf 'module briq.cloud/etcd-build\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
    "$ETCD_VERSION" >"$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$dir/tools.go"
  log "building etcd $ETCD_VERSION"
  (cd "$dir" && go mod tidy -e >&2 && go build -trimpath -ldflags "-s -w" -o "$OUT/bin/etcd" go.etcd.io/etcd/server/v3 >&2)
}

# An older cache may hold all but the newer binaries: build only what is missing.
[[ -x "$OUT/bin/etcd" ]] || build_etcd
build_kubernetes
log "built in $(( $(date +%s) - start )) s: $OUT"
echo "$OUT"
