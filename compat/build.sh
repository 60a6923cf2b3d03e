#!/usr/bin/env bash
# Builds the previous release's operator binary from its commit (compat/<version>/commit), once,
# into a cache outside the repo, for the upgrade test (tests/upgrade.rs): that release's code as
# it was tagged, taken from this repository's own history with `git archive` (no worktree, so the
# checkout is left alone) and built with its own Cargo.lock. Prints the binary's path on stdout
# (last line); progress goes to stderr. The tests never build it: they read BRIQ_PREVIOUS_OPERATOR,
# or run this script with --cached, which only prints the path when it is already built.
#
#   bash compat/build.sh [--cached] [VERSION]     (VERSION defaults to the newest in compat/)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${BRIQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/briq-operator}"
cached_only=false
if [[ "${1:-}" == "--cached" ]]; then cached_only=true; shift; fi
version="${1:-$(cd "$root/compat" && ls -d [0-9]*/ | tr -d / | sort -V | tail -1)}"
commit="$(tr -d '[:space:]' < "$root/compat/$version/commit")"
OUT="$CACHE_ROOT/operator-$version-${commit:0:12}"

log() { printf '[previous release build] %s\n' "$*" >&2; }

if [[ -x "$OUT/bin/briq-operator" && -f "$OUT/.complete" ]]; then
  log "cached: $OUT"
  echo "$OUT/bin/briq-operator"
  exit 0
fi
if $cached_only; then
  log "operator $version not built yet: run bash compat/build.sh (make test does)"
  exit 1
fi
if ! git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null; then
  log "commit $commit (release $version) is not in this clone's history; a shallow clone needs"
  log "'git fetch --unshallow' first"
  exit 1
fi
command -v cargo >/dev/null || { log "cargo is required"; exit 1; }
mkdir -p "$CACHE_ROOT"
# One builder at a time (parallel CI jobs, several worktrees).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$CACHE_ROOT/.operator-$version.lock"
  flock 9
  if [[ -x "$OUT/bin/briq-operator" && -f "$OUT/.complete" ]]; then echo "$OUT/bin/briq-operator"; exit 0; fi
fi
work="$(mktemp -d "$CACHE_ROOT/operator-$version.XXXXXX")"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
log "building briq-operator $version from $commit (a debug build: a few minutes on a cold cache)"
mkdir -p "$work/src"
git -C "$root" archive "$commit" | tar -x -C "$work/src"
# Built in this checkout's target directory: the release depends on nearly all the same crates at
# the same versions as this tree, and cargo compiles each (crate, version, features, profile)
# once for both, so on a fresh machine the tests' build reuses most of this one. The release's
# own crate is a package of its own there (another path); only its binary lands where this
# tree's goes, target/debug/briq-operator: it is moved out at once, and cargo links this tree's
# there again on its next build.
target="${CARGO_TARGET_DIR:-$root/target}"
(cd "$work/src" && CARGO_TARGET_DIR="$target" cargo build --locked --quiet \
  -p briq-operator --bin briq-operator >&2)
rm -rf "$OUT"
mkdir -p "$OUT/bin"
mv "$target/debug/briq-operator" "$OUT/bin/"
rm -f "$target/debug/briq-operator.d"
echo "$commit" > "$OUT/commit"
touch "$OUT/.complete"
log "built in $(( $(date +%s) - start )) s: $OUT"
echo "$OUT/bin/briq-operator"
