#!/usr/bin/env bash
# The release artifacts (`make release`), versioned from Cargo.toml (the chart carries the
# crate's version; tests/chart.rs checks it):
#   install.yaml                the namespace briq-system, the CRDs, RBAC, the Deployment and the
#                               admission policy, for `kubectl apply --server-side -f install.yaml`;
#                               without the aggregated API (subresources), whose serving key would
#                               otherwise be one key published to everyone: Helm makes one per
#                               install
#   briq-operator-VERSION.tgz   the chart (`helm package`), for `helm install` or an OCI registry
# and, given the release binary:
#   kubectl-briq_vVERSION_linux_amd64.tar.gz   the binary as the kubectl plugin `kubectl-briq`
#   briq.yaml                   its krew plugin manifest (`kubectl krew install --manifest=briq.yaml
#                               --archive=…` before it is in an index), pointing at the archive's
#                               release download with its sha256
# Usage: dev/release.sh HELM OUT_DIR [BINARY]. Prints the paths it wrote.
set -euo pipefail
helm=$1
out=$2
binary=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
chart="$root/charts/briq-operator"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[ -n "$version" ] || { echo "release: no version in $root/Cargo.toml" >&2; exit 1; }
mkdir -p "$out"
{
  printf '# briq-operator %s: kubectl apply --server-side -f install.yaml\n' "$version"
  printf -- '---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: briq-system\n'
  "$helm" template briq-operator "$chart" --namespace briq-system --include-crds \
    --set subresources.enabled=false
} > "$out/install.yaml"
"$helm" package "$chart" --version "$version" --app-version "$version" --destination "$out" >/dev/null
echo "$out/install.yaml"
echo "$out/briq-operator-$version.tgz"
[ -n "$binary" ] || exit 0

repository=$(sed -n 's/^repository = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
archive="kubectl-briq_v${version}_linux_amd64.tar.gz"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$binary" "$stage/kubectl-briq"
# The same archive from the same binary: fixed owner, time and order, gzip without a name.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" -c kubectl-briq \
  | gzip -n > "$out/$archive"
sha256=$(sha256sum "$out/$archive" | cut -d' ' -f1)
cat > "$out/briq.yaml" <<MANIFEST
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: briq
spec:
  version: v$version
  homepage: $repository
  shortDescription: Run Python actions in briq sandboxes (BriqExecutor, Execution)
  description: |
    kubectl briq runs code in a BriqExecutor as an Execution and prints its logs, output and
    answer (exec), lists executors and Executions (get) and prints an Execution's logs (logs).
    It talks to the cluster as kubectl does; the briq-operator must be installed.
  platforms:
    - selector:
        matchLabels:
          os: linux
          arch: amd64
      uri: $repository/releases/download/v$version/$archive
      sha256: $sha256
      bin: kubectl-briq
      files:
        - from: kubectl-briq
          to: .
MANIFEST
echo "$out/$archive"
echo "$out/briq.yaml"
