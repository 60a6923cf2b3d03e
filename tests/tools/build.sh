#!/usr/bin/env bash
# Builds the tools of the chart, GitOps and release tests from the Go module proxy, once per
# version, into a cache outside the repo: helm (lint, template, OCI push), tests/kstatus
# (cli-utils' kstatus, the status library Flux uses), go-containerregistry's crane and registry
# (the operator image's push, pull and a local registry), krew (installs the plugin manifest) and
# tests/promcheck (Prometheus' own rule-file and PromQL parsers, for the dashboard and alerts);
# and downloads the Debian packages of the operator image (debs/, `apt-get download`); and mdbook
# (the docs book, `cargo install` from crates.io) into a cache directory of its own, keyed by its
# version, linked as bin/mdbook (so a new mdbook version rebuilds mdbook only). Prints the
# directory holding bin/ and debs/ (last line on stdout); progress goes to stderr. The tests never build anything: they read BRIQ_TOOLS_DIR, or run
# this script with --cached, which only prints the directory when it is already built.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v4.3.2}"
GGCR_VERSION="${GGCR_VERSION:-v0.22.1}"
KREW_VERSION="${KREW_VERSION:-v0.4.3}"
MDBOOK_VERSION="${MDBOOK_VERSION:-0.5.4}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE_ROOT="${BRIQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/briq-operator}"
kstatus_src="$root/tests/kstatus"
kstatus_hash="$(cat "$kstatus_src/go.mod" "$kstatus_src/go.sum" "$kstatus_src/main.go" | sha256sum | cut -c1-12)"
promcheck_src="$root/tests/promcheck"
promcheck_hash="$(cat "$promcheck_src/go.mod" "$promcheck_src/go.sum" "$promcheck_src/main.go" | sha256sum | cut -c1-8)"
# The operator image's packages: images/operator/packages (one name per line).
debs_hash="$(sha256sum < "$root/images/operator/packages" | cut -c1-8)"
OUT="$CACHE_ROOT/tools-helm-$HELM_VERSION-kstatus-$kstatus_hash-ggcr-$GGCR_VERSION-krew-$KREW_VERSION-promcheck-$promcheck_hash-debs-$debs_hash"
tools=(helm kstatus crane registry krew promcheck)

MDBOOK_OUT="$CACHE_ROOT/mdbook-$MDBOOK_VERSION"

log() { printf '[tools build] %s\n' "$*" >&2; }

# mdbook: its own directory, complete marker written last; linked into $OUT/bin once both exist.
mdbook_built() { [[ -x "$MDBOOK_OUT/bin/mdbook" && -f "$MDBOOK_OUT/.complete" ]]; }
build_mdbook() {
  mdbook_built && return 0
  command -v cargo >/dev/null || { log "cargo is required for mdbook"; exit 1; }
  mkdir -p "$CACHE_ROOT"
  local mtmp
  mtmp="$(mktemp -d "$CACHE_ROOT/mdbook.XXXXXX")"
  log "building mdbook $MDBOOK_VERSION (cargo install; a few minutes on a cold cache)"
  cargo install mdbook --locked --version "$MDBOOK_VERSION" --no-default-features \
    --features search --root "$mtmp" >&2 || { rm -rf "$mtmp"; exit 1; }
  rm -rf "$MDBOOK_OUT"
  mkdir -p "$MDBOOK_OUT"
  mv "$mtmp/bin" "$MDBOOK_OUT/"
  rm -rf "$mtmp"
  touch "$MDBOOK_OUT/.complete"
}
link_mdbook() {
  if mdbook_built && [[ -d "$OUT/bin" ]]; then ln -sfn "$MDBOOK_OUT/bin/mdbook" "$OUT/bin/mdbook"; fi
}

built() {
  for tool in "${tools[@]}"; do [[ -x "$OUT/bin/$tool" ]] || return 1; done
  [[ -f "$OUT/debs/.complete" ]]
}
if built; then
  [[ "${1:-}" == "--cached" ]] || build_mdbook
  link_mdbook
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

log "building helm $HELM_VERSION (a few minutes on a cold cache)"
GOBIN="$tmp/bin" go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
  "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
log "building tests/kstatus (sigs.k8s.io/cli-utils kstatus)"
(cd "$kstatus_src" && go build -trimpath -ldflags "-s -w" -o "$tmp/bin/kstatus" . >&2)
log "building tests/promcheck (prometheus model/rulefmt and promql/parser; about 40 s on a cold cache)"
(cd "$promcheck_src" && go build -trimpath -ldflags "-s -w" -o "$tmp/bin/promcheck" . >&2)
log "building crane and registry (go-containerregistry $GGCR_VERSION), krew $KREW_VERSION"
GOBIN="$tmp/bin" go install -trimpath -ldflags "-s -w" \
  "github.com/google/go-containerregistry/cmd/crane@$GGCR_VERSION" \
  "github.com/google/go-containerregistry/cmd/registry@$GGCR_VERSION" >&2
GOBIN="$tmp/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/krew/cmd/krew@$KREW_VERSION" >&2

# The image's Debian packages, as the distro's package manager resolves them today (their
# versions go into the image's SBOM). A fresh machine may have no package lists yet.
mapfile -t packages < <(grep -v '^#' "$root/images/operator/packages" | grep .)
log "downloading ${packages[*]} (apt-get download)"
mkdir -p "$tmp/debs"
if ! (cd "$tmp/debs" && apt-get download "${packages[@]}" >&2); then
  [[ $(id -u) == 0 ]] || { log "apt-get download failed; as root, apt-get update first"; exit 1; }
  log "apt-get update (no package lists yet)"
  apt-get update >&2
  (cd "$tmp/debs" && apt-get download "${packages[@]}" >&2)
fi
touch "$tmp/debs/.complete"

mkdir -p "$OUT"
rm -rf "$OUT/bin" "$OUT/debs"
mv "$tmp/bin" "$tmp/debs" "$OUT/"
build_mdbook
link_mdbook
log "built in $(( $(date +%s) - start )) s: $OUT"
echo "$OUT"
