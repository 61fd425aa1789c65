#!/usr/bin/env bash
# Keeps what `make test` leaves on disk bounded, and says early when the disk is too full for a run.
#
#   bash e2e/disk.sh
#
# - The Cargo target dir (CARGO_TARGET_DIR, else ./target) grows with every change of a dependency
#   or a flag (new artifact hashes beside the old ones) and with every incremental session. Above
#   KANDEV_TARGET_CAP_GIB (default 16) its incremental caches go first; if it is still above, its
#   debug dir goes (the next build compiles the dependencies again, a few minutes).
# - The images' build engine keeps the images of earlier builds; e2e/images.sh removes ours.
# - Below KANDEV_MIN_FREE_GIB (default 6) free on the disk of the target dir or of the cache, it
#   stops with what uses the space: a full run needs about that much (the real node's containerd
#   unpacks both images, the tests build their binaries).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { printf '[disk.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

target="${CARGO_TARGET_DIR:-$PWD/target}"
cache="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}"
cap_gib="${KANDEV_TARGET_CAP_GIB:-16}"
min_free_gib="${KANDEV_MIN_FREE_GIB:-6}"
[[ "$cap_gib" =~ ^[0-9]+$ && "$min_free_gib" =~ ^[0-9]+$ ]] \
  || die "KANDEV_TARGET_CAP_GIB and KANDEV_MIN_FREE_GIB take whole GiB, got '$cap_gib' and '$min_free_gib'"

gib_used() { du -s --block-size=1G "$1" 2>/dev/null | cut -f1; }
gib_free() { df --output=avail --block-size=1G "$1" | tail -n 1 | tr -d ' '; }

if [[ -d "$target" ]]; then
  used="$(gib_used "$target")"
  if ((used > cap_gib)); then
    log "$target holds ${used} GiB (cap ${cap_gib} GiB, KANDEV_TARGET_CAP_GIB): removing its incremental caches"
    rm -rf "$target"/*/incremental
    used="$(gib_used "$target")"
    if ((used > cap_gib)); then
      log "$target still holds ${used} GiB: removing its debug builds (the next build compiles the dependencies again)"
      rm -rf "$target/debug"
    fi
    log "$target now holds $(du -sh "$target" | cut -f1)"
  fi
fi

mkdir -p "$cache"
for dir in "$(dirname "$target")" "$cache"; do
  free="$(gib_free "$dir")"
  if ((free < min_free_gib)); then
    log "the largest parts of $cache and $target:"
    du -sh "$cache"/* "$target"/* 2>/dev/null | sort -h | tail -n 8 >&2
    die "only ${free} GiB free on the disk of $dir; a full run needs ${min_free_gib} GiB (KANDEV_MIN_FREE_GIB)"
  fi
done
