#!/usr/bin/env bash
# Runs the end-to-end tests (every tests/e2e_*.rs target, `#[ignore]`d tests included) against a
# real control plane with kwok. See e2e/README.md.
#
#   bash e2e/test.sh [extra cargo test args, e.g. a test name filter]
#
# If KUBECONFIG is set and the cluster answers, it is reused and left running. Otherwise a cluster
# is brought up with e2e/cluster.sh and ALWAYS torn down on exit (also on Ctrl-C / SIGTERM).
# The exit code is the tests' exit code.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cd "$repo"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"

log() { printf '[test.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
t0=$SECONDS

bin="$("$here/bin.sh" | tail -n 1)"
export PATH="$target_dir/debug:$bin:$PATH"

own_cluster=0
own_harness_pid=""
tests_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$tests_pid" ]] && kill -0 "$tests_pid" 2>/dev/null; then
    log "interrupted: stopping the tests (process group $tests_pid)"
    kill -TERM -- "-$tests_pid" 2>/dev/null || true
    wait "$tests_pid" 2>/dev/null || true
  fi
  if [[ -n "$own_harness_pid" ]]; then
    kill -TERM "$own_harness_pid" 2>/dev/null || true
    wait "$own_harness_pid" 2>/dev/null || true
  fi
  if [[ $own_cluster == 1 ]]; then
    log "tearing down the cluster this run started"
    bash "$here/cluster.sh" down || rc=$((rc == 0 ? 1 : rc))
  fi
  log "done in $((SECONDS - t0))s, exit code $rc"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

our_kubeconfig="$(bash "$here/cluster.sh" env | sed 's/^export KUBECONFIG=//')"
if [[ -n "${KUBECONFIG:-}" ]] && kubectl --kubeconfig "${KUBECONFIG%%:*}" get --raw /readyz >/dev/null 2>&1; then
  log "reusing the cluster of KUBECONFIG=$KUBECONFIG (left running)"
else
  [[ -n "${KUBECONFIG:-}" ]] && log "KUBECONFIG=$KUBECONFIG does not answer; starting a cluster"
  own_cluster=1
  t=$SECONDS
  out="$(bash "$here/cluster.sh" up)"
  export KUBECONFIG="${out##*KUBECONFIG=}"
  log "cluster up in $((SECONDS - t))s"
fi

t=$SECONDS
log "cargo build --workspace --bins"
cargo build --workspace --bins
log "built in $((SECONDS - t))s"

harness="$target_dir/debug/kandev-e2e-harness"
if [[ "${KUBECONFIG%%:*}" == "$our_kubeconfig" ]]; then
  # Our cluster: the harness lives with it (a no-op when it already runs).
  KANDEV_HARNESS_BIN="$harness" bash "$here/cluster.sh" up >/dev/null
else
  # Someone else's kwok cluster: run a harness for the duration of the tests only.
  state="$(mktemp -d "${TMPDIR:-/tmp}/kandev-e2e-harness.XXXXXX")"
  log "starting a harness for this run (state and log in $state)"
  "$harness" run --state-dir "$state" --selector kandev.dev/managed=true \
    --selector app.kubernetes.io/name=kandev-operator >"$state/harness.log" 2>&1 &
  own_harness_pid=$!
fi

mapfile -t targets < <(find tests -maxdepth 1 -name 'e2e_*.rs' -printf '%f\n' | sed 's/\.rs$//' | sort)
[[ ${#targets[@]} -gt 0 ]] || { log "no tests/e2e_*.rs targets"; exit 1; }
args=()
for t in "${targets[@]}"; do args+=(--test "$t"); done
t=$SECONDS
log "cargo test --no-fail-fast ${args[*]} -- --ignored --test-threads=1 $*"
# In its own process group (job control on), in the background: a SIGTERM/SIGINT to this script
# interrupts `wait` at once and cleanup() stops cargo and the test binary together.
set -m
cargo test --no-fail-fast "${args[@]}" -- --ignored --test-threads=1 "$@" &
tests_pid=$!
set +m
rc=0
wait "$tests_pid" || rc=$?
tests_pid=""
log "tests finished in $((SECONDS - t))s with exit code $rc"
exit "$rc"
