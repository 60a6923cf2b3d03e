#!/usr/bin/env bash
# Builds the tools of the chart and GitOps tests from the Go module proxy, once per version, into
# a cache outside the repo: helm (lint, template) and tests/kstatus (cli-utils' kstatus, the status
# library Flux uses). Prints the directory holding bin/helm and bin/kstatus (last line on stdout);
# progress goes to stderr. The tests never build anything: they read BRIQ_TOOLS_DIR, or run
# this script with --cached, which only prints the directory when it is already built.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v4.3.2}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE_ROOT="${BRIQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/briq-operator}"
kstatus_src="$root/tests/kstatus"
kstatus_hash="$(cat "$kstatus_src/go.mod" "$kstatus_src/go.sum" "$kstatus_src/main.go" | sha256sum | cut -c1-12)"
OUT="$CACHE_ROOT/tools-helm-$HELM_VERSION-kstatus-$kstatus_hash"

log() { printf '[tools build] %s\n' "$*" >&2; }

if [[ -x "$OUT/bin/helm" && -x "$OUT/bin/kstatus" ]]; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi
# `--cached`: what the tests call; they never reach a registry.
if [[ "${1:-}" == "--cached" ]]; then
  log "not built yet: run bash tests/tools/build.sh (make test does)"
  exit 1
fi

command -v go >/dev/null || { log "go is required (Go >= 1.24)"; exit 1; }
mkdir -p "$CACHE_ROOT"
# One builder at a time (parallel CI jobs, several worktrees).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$CACHE_ROOT/.tools.lock"
  flock 9
fi
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
tmp="$(mktemp -d "$CACHE_ROOT/tools.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
start=$(date +%s)

if [[ ! -x "$OUT/bin/helm" ]]; then
  log "building helm $HELM_VERSION (a few minutes on a cold cache)"
  GOBIN="$tmp/bin" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
else
  cp "$OUT/bin/helm" "$tmp/bin/helm"
fi
log "building tests/kstatus (sigs.k8s.io/cli-utils kstatus)"
(cd "$kstatus_src" && go build -trimpath -ldflags "-s -w" -o "$tmp/bin/kstatus" . >&2)

mkdir -p "$OUT/bin"
mv "$tmp/bin/helm" "$tmp/bin/kstatus" "$OUT/bin/"
log "built in $(( $(date +%s) - start )) s: $OUT"
echo "$OUT"
