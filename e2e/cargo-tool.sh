#!/usr/bin/env bash
# Installs a cargo tool at a pinned version, once, under ~/.cache/kandev-operator/cargo-tools, and
# prints its bin directory on the last line (the cache survives `cargo clean` and fresh clones).
#
#   bash e2e/cargo-tool.sh cargo-deny 0.20.2
set -euo pipefail
crate="$1" version="$2"
root="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}/cargo-tools/$crate-$version"
if [[ ! -x "$root/bin/$crate" ]]; then
  printf '[cargo-tool.sh %s] installing %s %s into %s (once; a few minutes)\n' \
    "$(date +%H:%M:%S)" "$crate" "$version" "$root" >&2
  # Its own target dir, removed afterwards: only the binary is kept.
  build="$(mktemp -d "${TMPDIR:-/tmp}/cargo-tool.XXXXXX")"
  trap 'rm -rf "$build"' EXIT
  cargo install --locked --quiet --root "$root" --target-dir "$build" "$crate" --version "=$version"
fi
echo "$root/bin"
