#!/usr/bin/env bash
# `make bench`: the fleet benchmark (docs/performance.md). Builds what is missing, starts its own
# kwok cluster (name kandev-bench) with kube-apiserver's audit log on and the harness playing the
# agentctl pods, runs `kandev-bench`, and ALWAYS tears the cluster down (also on failure/Ctrl-C).
#
# Settings (environment): BENCH_N (default 200), BENCH_SWEEP (e.g. 50,100,200,400: several sizes
# and plots), BENCH_PHASES (launch,loss,resume,storm,idle; also suspend), BENCH_CONTENDERS
# (ours,floor,agent-sandbox), BENCH_IDLE_SECONDS (60), BENCH_IDLE_FLEET (e.g. 10000: only the
# idle-fleet mode, without the harness), BENCH_OUT (target/bench), BENCH_PROFILE (release, the
# default: what the image ships, optimised; dev: the debug build the tests use, for bench-smoke),
# BENCH_OPERATOR_ARGS (more flags for our operator, e.g. "--max-concurrent-reconciles 400").
# Extra arguments go to kandev-bench (see `target/release/kandev-bench --help`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
export KANDEV_CLUSTER=kandev-bench
cache="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}"
cluster_dir="$cache/clusters/$KANDEV_CLUSTER"

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
t0=$SECONDS

case "${BENCH_PROFILE:=release}" in
  release) build=(cargo build --release --workspace --bins) profile_dir=release ;;
  dev) build=(cargo build --workspace --bins) profile_dir=debug ;;
  *) log "BENCH_PROFILE must be release or dev, not '$BENCH_PROFILE'"; exit 2 ;;
esac
export BENCH_PROFILE
# cluster.sh puts this directory first on the PATH of kwok and the harness (agentctl, test agent).
export KANDEV_BIN_DIR="$target_dir/$profile_dir"

bin="$(bash "$repo/e2e/bin.sh" | tail -n 1)"
export PATH="$KANDEV_BIN_DIR:$bin:$PATH"
log "${build[*]}"
"${build[@]}"

bench_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$bench_pid" ]] && kill -0 "$bench_pid" 2>/dev/null; then
    kill -TERM "$bench_pid" 2>/dev/null || true
    wait "$bench_pid" 2>/dev/null || true
  fi
  # The harness's log and the control plane's component logs go before the cluster does.
  local logs="${BENCH_OUT:-$target_dir/bench}/work"
  if [[ -d "$cluster_dir" ]]; then
    mkdir -p "$logs"
    cp "$cluster_dir/harness.log" "$logs/harness.log" 2>/dev/null || true
    # kube-apiserver's audit log: every request with its client and time, to follow one
    # session through the API server (e.g. when kwok marked its pod Running).
    cp "${KANDEV_BENCH_AUDIT_LOG:-}" "$logs/audit.log" 2>/dev/null || true
  fi
  log "tearing down cluster $KANDEV_CLUSTER (harness and audit logs kept in $logs)"
  bash "$repo/e2e/cluster.sh" down || rc=$((rc == 0 ? 1 : rc))
  log "done in $((SECONDS - t0))s, exit code $rc"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A clean cluster every time: the audit policy is set when it is created.
bash "$repo/e2e/cluster.sh" down >/dev/null 2>&1 || true
harness=()
[[ -z "${BENCH_IDLE_FLEET:-}" ]] && harness=(KANDEV_HARNESS_BIN="$KANDEV_BIN_DIR/kandev-e2e-harness")
out="$(env "${harness[@]}" KANDEV_AUDIT_POLICY="$here/audit-policy.yaml" bash "$repo/e2e/cluster.sh" up)"
export KUBECONFIG="${out##*KUBECONFIG=}"
export KANDEV_BENCH_AUDIT_LOG="$cluster_dir/kwok/clusters/$KANDEV_CLUSTER/logs/audit.log"
export KANDEV_BENCH_HARNESS_STATE="$cluster_dir/harness"
export KANDEV_BENCH_SANDBOX_BIN="$bin/agent-sandbox-controller"
export KANDEV_BENCH_SANDBOX_CRDS="$bin/../agent-sandbox-crds"
export BENCH_COMMIT="${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+dirty')}"
what="N=${BENCH_SWEEP:-${BENCH_N:-200}}"
[[ -n "${BENCH_IDLE_FLEET:-}" ]] && what="idle fleet of $BENCH_IDLE_FLEET sessions"
log "cluster up; running kandev-bench ($what)"
# In the background, so a SIGTERM to this script reaches cleanup() at once.
"$KANDEV_BIN_DIR/kandev-bench" --out "${BENCH_OUT:-$target_dir/bench}" "$@" &
bench_pid=$!
rc=0
wait "$bench_pid" || rc=$?
bench_pid=""
exit "$rc"
