#!/usr/bin/env bash
# The real-node tier (`make e2e-real`): a cluster of its own with a real kubelet node on
# containerd (`KANDEV_NODE=real e2e/cluster.sh up`, which imports target/images/*.tar), then
# tests/real_node.rs: the chart installed with the images of `make images`, a real agent lost and
# resumed in real containers. The cluster is ALWAYS torn down at the end, and the run fails if
# anything of the node is left on the host (e2e/node.sh check-clean). Needs root.
#
#   bash e2e/real.sh [extra cargo test args, e.g. a test name filter]
#
# Environment: KANDEV_CACHE, CARGO_TARGET_DIR (as the other scripts); KANDEV_CLUSTER (default
# kandev-real).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cd "$repo"
export KANDEV_CLUSTER="${KANDEV_CLUSTER:-kandev-real}" KANDEV_NODE=real
cache="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}"

log() { printf '[real.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
t0=$SECONDS
[[ $EUID == 0 ]] || { log "ERROR: the real node needs root (kubelet, containerd, network)"; exit 1; }
for archive in target/images/kandev-operator.tar target/images/agentctl.tar; do
  [[ -f "$archive" ]] || { log "ERROR: $archive is missing: run 'make images' first"; exit 1; }
done

tests_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$tests_pid" ]] && kill -0 "$tests_pid" 2>/dev/null; then
    log "interrupted: stopping the tests (process group $tests_pid)"
    kill -TERM -- "-$tests_pid" 2>/dev/null || true
    wait "$tests_pid" 2>/dev/null || true
  fi
  log "tearing down cluster $KANDEV_CLUSTER"
  bash "$here/cluster.sh" down || rc=$((rc == 0 ? 1 : rc))
  # `down` checks the node's leftovers itself; once more here, so that a skipped check fails too.
  bash "$here/node.sh" check-clean || rc=$((rc == 0 ? 1 : rc))
  log "done in $((SECONDS - t0))s, exit code $rc"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t=$SECONDS
log "cargo build --workspace --bins (the kubectl plugin the tests run)"
cargo build --workspace --bins
log "built in $((SECONDS - t))s"

t=$SECONDS
out="$(bash "$here/cluster.sh" up)"
export KUBECONFIG="${out##*KUBECONFIG=}"
log "cluster with a real node up in $((SECONDS - t))s"
# What tests/real_node.rs needs to find the node and look into its runtime.
export KANDEV_REAL_NODE="${KANDEV_NODE_NAME:-real-node-0}"
export KANDEV_CONTAINERD_ADDRESS="$cache/clusters/$KANDEV_CLUSTER/node/containerd/containerd.sock"
export PATH="$(bash "$here/bin.sh" --print):$PATH"

t=$SECONDS
log "cargo test --test real_node -- --ignored --test-threads=1 $*"
set -m
cargo test --test real_node -- --ignored --test-threads=1 --nocapture "$@" &
tests_pid=$!
set +m
rc=0
wait "$tests_pid" || rc=$?
tests_pid=""
log "tests finished in $((SECONDS - t))s with exit code $rc"
exit "$rc"
