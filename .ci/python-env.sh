#!/usr/bin/env bash
# Create (once) the Python venv for the bridge tests and the local sandbox server, install the
# three Python parts editable (bridge/sandbox, bridge/agent, dev/python), fill (once) the
# wheelhouse of the agent client's dependencies, and print the venv's path as the last line on
# stdout. Progress goes to stderr.
#
#   VENV="$(bash .ci/python-env.sh | tail -n 1)"
#
# The venv lives in ${BRIQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/briq-operator} and is named
# after the hash of bridge/requirements-test.txt, so a change of pins gets a fresh venv while
# every checkout (worktrees, CI's fresh clone) with the same pins shares one. The wheelhouse is
# beside it, named after the same hash: wheelhouse-HASH for venv-HASH.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$root/bridge/requirements-test.txt"
python="${BRIQ_PYTHON:-python3}"
cache="${BRIQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/briq-operator}"

log() { printf 'python-env: %s\n' "$*" >&2; }

# As root, the bridge runs the sandbox kernel as uid 65534 (bridge/PROTOCOL.md "Users and
# permissions"), which must be able to run this venv's Python: root's home is usually private
# (0700), so the venv goes to /var/cache and its base interpreter must be world-readable too.
if [ "$(id -u)" = 0 ]; then
  [ -n "${BRIQ_CACHE_DIR:-}" ] || cache=/var/cache/briq-operator
  reachable() { # <python>: exit 0 when every directory on the way to its prefix is world-traversable
    "$1" -c 'import os, stat, sys
for top in {os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)}:
    path = top
    while True:
        mode = os.stat(path).st_mode
        if not mode & (stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH):
            sys.exit(1)
        if path == "/":
            break
        path = os.path.dirname(path)' 2>/dev/null
  }
  if [ -z "${BRIQ_PYTHON:-}" ] && ! reachable "$python"; then
    for candidate in /usr/local/bin/python3 /usr/bin/python3; do
      if [ -x "$candidate" ] && reachable "$candidate"; then python="$candidate"; break; fi
    done
    reachable "$python" || log "warning: uid 65534 cannot run $python; sandbox kernels will not start"
  fi
fi

hash="$("$python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest()[:12])' "$requirements")"
venv="$cache/venv-$hash"
mkdir -p "$cache"

# One creator at a time per venv (parallel CI jobs, several worktrees).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/.venv-$hash.lock"
  flock 9
fi

# The marker is written last: a venv without it is a half-built one from an interrupted run.
if [ ! -f "$venv/.briq-complete" ] || ! "$venv/bin/python" -c '' 2>/dev/null; then
  log "creating $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --progress-bar off \
    -r "$requirements" >&2
  touch "$venv/.briq-complete"
else
  log "reusing $venv"
fi

# The agent client's dependencies as wheels, at the pinned versions, for the test that installs
# the built wheel into a fresh venv offline (`pip install --no-index --find-links WHEELHOUSE`,
# bridge/agent/tests/test_wheel.py). The marker, written last, holds the requirements it was
# filled for: a wheelhouse without it is a half-filled one, one for other requirements is stale.
wheelhouse="$cache/wheelhouse-$hash"
client_requirements="$("$venv/bin/python" -c 'import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib
with open(sys.argv[1], "rb") as pyproject:
    print("\n".join(tomllib.load(pyproject)["project"]["dependencies"]))' \
  "$root/bridge/agent/pyproject.toml")"
if [ "$(cat "$wheelhouse/.briq-complete" 2>/dev/null)" != "$client_requirements" ]; then
  log "filling $wheelhouse"
  rm -rf "$wheelhouse"
  mapfile -t requirement_args <<<"$client_requirements"
  "$venv/bin/python" -m pip download --disable-pip-version-check --no-input --progress-bar off \
    --only-binary=:all: --constraint "$requirements" --dest "$wheelhouse" \
    "${requirement_args[@]}" >&2
  printf '%s' "$client_requirements" >"$wheelhouse/.briq-complete"
else
  log "reusing $wheelhouse"
fi

# The venv is shared between checkouts, so point each editable install (the sandbox bridge, the
# agent client, the dev helpers) at this checkout when it points elsewhere, is missing (-I: not
# found through the current directory) or was installed at another version than its
# pyproject.toml's (the agent client's follows Cargo.toml's: its metadata must follow a bump).
# setuptools is pinned in the requirements: no build isolation, no network.
editable() { # <distribution> <import name> <expected path of the module or package> <project>
  local found
  found="$("$venv/bin/python" -I -c 'import importlib.metadata, importlib.util, os, re, sys
distribution, name, project = sys.argv[1:]
spec = importlib.util.find_spec(name)
origin = spec.origin if spec.submodule_search_locations is None else spec.submodule_search_locations[0]
with open(os.path.join(project, "pyproject.toml")) as pyproject:
    wanted = re.search(r"^version = \"(.*)\"$", pyproject.read(), re.MULTILINE).group(1)
installed = importlib.metadata.version(distribution)
print(os.path.realpath(origin) if installed == wanted else f"version {installed}, not {wanted}")' \
    "$1" "$2" "$4" 2>/dev/null || true)"
  if [ "$found" != "$(realpath "$3")" ]; then
    log "installing $4 (editable)"
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --progress-bar off \
      --no-deps --no-build-isolation -e "$4" >&2
  fi
}
editable briq-sandbox-bridge briq_sandbox "$root/bridge/sandbox/briq_sandbox.py" \
  "$root/bridge/sandbox"
editable briq-operator-client briq_operator_client "$root/bridge/agent/briq_operator_client" \
  "$root/bridge/agent"
editable briq-dev-helpers briq_dev "$root/dev/python/briq_dev" "$root/dev/python"

echo "$venv"
