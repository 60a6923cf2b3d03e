#!/usr/bin/env bash
# The release artifacts (`make release`), versioned from Cargo.toml (the chart carries the
# crate's version; tests/chart.rs checks it):
#   install.yaml                the namespace briq-system, the CRDs, RBAC, the Deployment and the
#                               admission policy, for `kubectl apply --server-side -f install.yaml`
#   briq-operator-VERSION.tgz   the chart (`helm package`), for `helm install` or an OCI registry
# Usage: dev/release.sh HELM OUT_DIR. Prints the paths it wrote.
set -euo pipefail
helm=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
chart="$root/charts/briq-operator"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[ -n "$version" ] || { echo "release: no version in $root/Cargo.toml" >&2; exit 1; }
mkdir -p "$out"
{
  printf '# briq-operator %s: kubectl apply --server-side -f install.yaml\n' "$version"
  printf -- '---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: briq-system\n'
  "$helm" template briq-operator "$chart" --namespace briq-system --include-crds
} > "$out/install.yaml"
"$helm" package "$chart" --version "$version" --app-version "$version" --destination "$out" >/dev/null
echo "$out/install.yaml"
echo "$out/briq-operator-$version.tgz"
