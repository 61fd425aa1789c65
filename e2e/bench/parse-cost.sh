#!/usr/bin/env bash
# The parse cost of one line (issue #40): what `agentctl restore` spends, in wall time and peak
# RSS, when the agent's `session/load` answer is one line of tiny JSON values, against normal
# restores. It runs `agentctl restore` against `kandev-test-agent` (e2e/test_agent) for:
#   ok          a normal session/load, PARSE_COST_RUNS times (median, min and max wall time);
#   replay-N    a normal session/load replaying PARSE_COST_REPLAY short messages;
#   string      a PARSE_COST_AMOUNT-byte replay line of one long string (7 MiB is within the
#               replay line limit);
#   dense, objects, deep
#               the load's answer is one PARSE_COST_AMOUNT-byte line of zeros, of small objects,
#               of nested arrays (`--flood` in the test agent's docs).
# and prints one line each: shape, wall time, peak RSS, and the start of the restore's JSON
# report (PARSE_COST_CHARS characters, 150 by default, after its method and session id, which
# are the same in every restore: `session/load` of `saved-session-1`).
#
#   e2e/bench/parse-cost.sh [--debug]
#
# Settings (environment): PARSE_COST_RUNS (20), PARSE_COST_AMOUNT (bytes, 7340032 = 7 MiB),
# PARSE_COST_REPLAY (2000), PARSE_COST_TIMEOUT (agentctl's --timeout, 60 s; a restore still
# running 30 s past it is killed, and reported by its exit status), PARSE_COST_AGENTCTL (an
# agentctl binary to measure instead of this tree's, e.g. one built from an earlier commit to
# compare; the test agent is still this tree's). The release profile by default (what the
# image ships); --debug measures the debug build the tests use.
#
# Peak RSS is /usr/bin/time's %M: the largest of agentctl and the children it waited for (the
# test agent, which writes through a 64 KiB buffer, so the figure is agentctl's). Without
# /usr/bin/time it is agentctl's VmHWM, polled from /proc every 10 ms.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"

profile=release
case "${1:-}" in
  "") ;;
  --debug) profile=debug ;;
  *) echo "usage: $0 [--debug]" >&2; exit 2 ;;
esac
runs="${PARSE_COST_RUNS:-20}"
amount="${PARSE_COST_AMOUNT:-7340032}"
replay="${PARSE_COST_REPLAY:-2000}"
limit="${PARSE_COST_TIMEOUT:-60}"
chars="${PARSE_COST_CHARS:-150}"
if ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then echo "PARSE_COST_RUNS must be 1 or more" >&2; exit 2; fi

build=(cargo build --locked --quiet)
[[ "$profile" == release ]] && build+=(--release)
if [[ -n "${PARSE_COST_AGENTCTL:-}" ]]; then
  agentctl="$PARSE_COST_AGENTCTL"
else
  "${build[@]}" --bin agentctl
  agentctl="$target_dir/$profile/agentctl"
fi
"${build[@]}" -p kandev-test-agent
agent="$target_dir/$profile/kandev-test-agent"

token=saved-session-1
work="$(mktemp -d /tmp/kandev-parse-cost-XXXXXX)"
current=""
cleanup() {
  # `timeout` leads its own process group: whatever is left of a run goes with it.
  if [[ -n "$current" ]]; then kill -KILL -- "-$current" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

timer=()
if [[ -x /usr/bin/time ]]; then timer=(/usr/bin/time -f %M -o "$work/rss"); fi

# run_restore AGENT-ARGS…: one restore; sets wall_ms, rss_mib and report.
run_restore() {
  rm -f "$work/rss"
  local start end peak=0 kib pid
  start=$(date +%s%N)
  timeout -k 5 "$((limit + 30))" "${timer[@]}" "$agentctl" restore --cwd "$work" --timeout "$limit" \
    --token "$token" -- "$agent" --advertise load --known-session "$token" "$@" \
    >"$work/out" 2>"$work/err" &
  current=$!
  if [[ ${#timer[@]} -eq 0 ]]; then
    # agentctl is `timeout`'s child; its peak RSS only grows, so the last sample is the peak.
    while kill -0 "$current" 2>/dev/null; do
      pid="$(pgrep -P "$current" | head -n 1 || true)"
      if [[ -n "$pid" ]]; then
        kib="$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)"
        [[ -n "$kib" ]] && ((kib > peak)) && peak=$kib
      fi
      sleep 0.01
    done
  fi
  local rc=0
  wait "$current" || rc=$?
  end=$(date +%s%N)
  kill -KILL -- "-$current" 2>/dev/null || true
  current=""
  wall_ms=$(((end - start) / 1000000))
  if [[ -s "$work/rss" ]]; then peak="$(tail -n 1 "$work/rss")"; fi
  rss_mib="$(awk -v kib="$peak" 'BEGIN {printf "%.1f", kib / 1024}')"
  report="$(head -n 1 "$work/out")"
  local usual="{\"method\":\"session/load\",\"sessionId\":\"$token\","
  if [[ "$report" == "$usual"* ]]; then report="{${report#"$usual"}"; fi
  report="${report:0:$chars}"
  # 0 and 1 are agentctl's outcomes; anything else (a timeout, a crash) shows its stderr.
  if ((rc > 1)); then
    report="exit $rc: ${report:-$(tail -n 1 "$work/err" | head -c 200)}"
  fi
}

line() { printf '%-12s %9s ms %9s MiB  %s\n' "$1" "$2" "$3" "$4"; }

printf '# %s, %s, %s bytes per flood line, %s (%s cores)\n' "$profile" \
  "${PARSE_COST_AGENTCTL:-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo '+changes')}" \
  "$amount" "$(uname -r)" "$(nproc)"
printf '%-12s %12s %13s  %s\n' shape wall "peak RSS" outcome

times=()
rss=()
for ((i = 0; i < runs; i++)); do
  run_restore
  times+=("$wall_ms")
  rss+=("$rss_mib")
done
mapfile -t sorted < <(printf '%s\n' "${times[@]}" | sort -n)
mapfile -t sorted_rss < <(printf '%s\n' "${rss[@]}" | sort -n)
median="${sorted[$((runs / 2))]}"
line ok "$median" "${sorted_rss[$((runs / 2))]}" "$report"
printf '%-12s median %s ms, min %s ms, max %s ms over %s runs; peak RSS %s–%s MiB\n' '' \
  "$median" "${sorted[0]}" "${sorted[$((runs - 1))]}" "$runs" "${sorted_rss[0]}" \
  "${sorted_rss[$((runs - 1))]}"

run_restore --replay "$replay"
line "replay-$replay" "$wall_ms" "$rss_mib" "$report"
run_restore --flood long-line --flood-amount "$amount"
line string "$wall_ms" "$rss_mib" "$report"
for shape in dense objects deep; do
  run_restore --flood "$shape" --flood-amount "$amount"
  line "$shape" "$wall_ms" "$rss_mib" "$report"
done
