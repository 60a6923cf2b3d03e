#!/usr/bin/env bash
# Create (once) the Python venv for the bridge tests and the local sandbox server, and print its
# path as the last line on stdout. Progress goes to stderr.
#
#   VENV="$(bash .ci/python-env.sh | tail -n 1)"
#
# The venv lives in ${BRIQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/briq-operator} and is named
# after the hash of bridge/requirements-test.txt, so a change of pins gets a fresh venv while
# every checkout (worktrees, CI's fresh clone) with the same pins shares one.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$root/bridge/requirements-test.txt"
python="${BRIQ_PYTHON:-python3}"
cache="${BRIQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/briq-operator}"

log() { printf 'python-env: %s\n' "$*" >&2; }

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

# The venv is shared between checkouts, so point the editable bridge install at this one when
# it points elsewhere. setuptools is pinned in the requirements: no build isolation, no network.
bridge_dir="$("$venv/bin/python" -c 'import briq_bridge, os; print(os.path.dirname(os.path.realpath(briq_bridge.__file__)))' 2>/dev/null || true)"
if [ "$bridge_dir" != "$(realpath "$root/bridge/briq_bridge")" ]; then
  log "installing bridge package from $root/bridge"
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --progress-bar off \
    --no-deps --no-build-isolation -e "$root/bridge" >&2
fi

echo "$venv"
