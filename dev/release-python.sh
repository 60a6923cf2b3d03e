#!/usr/bin/env bash
# The agent client's release artifacts (`make release`), offline, with the test venv's build and
# twine (bridge/requirements-test.txt):
#   briq_operator_client-VERSION-py3-none-any.whl   the wheel (import packages briq_operator_client
#                                                   and its former name briq_bridge, no tests)
#   briq_operator_client-VERSION.tar.gz             the sdist
# VERSION is the crate's (Cargo.toml); bridge/agent/pyproject.toml carries it, and this refuses
# to build when the two differ. Both files pass `twine check --strict` before they are written.
# The build runs on a copy of bridge/agent (no build/ or egg-info left in the checkout), the
# sdist first and the wheel from it, so the sdist is known to build.
# Usage: dev/release-python.sh PYTHON OUT_DIR. Prints the paths it wrote.
set -euo pipefail
python=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
project="$root/bridge/agent"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
client_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$project/pyproject.toml" | head -n 1)
if [ -z "$version" ] || [ "$client_version" != "$version" ]; then
  echo "release-python: bridge/agent/pyproject.toml has version '$client_version', Cargo.toml" \
    "'$version': they must be the same" >&2
  exit 1
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/src" "$stage/dist"
tar -C "$project" --exclude=./tests --exclude=./build --exclude=./dist --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=.pytest_cache -cf - . | tar -C "$stage/src" -xf -
# The same sources give the same wheel: file times from the last commit, not the clock.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 315532800)
fi
export SOURCE_DATE_EPOCH
# build's log is long: shown only when it fails.
if ! "$python" -m build --no-isolation --outdir "$stage/dist" "$stage/src" \
  >"$stage/build.log" 2>&1; then
  cat "$stage/build.log" >&2
  echo "release-python: python -m build failed (log above)" >&2
  exit 1
fi
wheel="$stage/dist/briq_operator_client-$version-py3-none-any.whl"
sdist="$stage/dist/briq_operator_client-$version.tar.gz"
for built in "$wheel" "$sdist"; do
  [ -f "$built" ] || { echo "release-python: $built was not built" >&2; exit 1; }
done
"$python" -m twine --no-color check --strict "$wheel" "$sdist" >&2
mkdir -p "$out"
cp "$wheel" "$sdist" "$out/"
echo "$out/$(basename "$wheel")"
echo "$out/$(basename "$sdist")"
