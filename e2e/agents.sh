#!/usr/bin/env bash
# Installs the real ACP agents the protocol tests talk to, pinned in e2e/agents.versions, from
# npm, cached outside the repo so `cargo clean` or a fresh clone does not pay for the download
# again.
#   e2e/agents.sh [PROFILE…]  install what is missing (of these profiles' agents, default: all of
#                             e2e/agents.versions), print the bin directory on the last line;
#                             `make demo` installs only claude-code
#   e2e/agents.sh --print     only print the bin directory
# Cache: $KANDEV_CACHE (default ~/.cache/kandev-operator)/agents. A warm run takes about a second:
# the pinned versions are read from the installed package.json files, npm is not started at all.
#
# Notes for running the agents (see docs/design.md §6, the protocol tier): claude-agent-acp refuses
# to start a session as root unless IS_SANDBOX=1; its engines field asks for a newer node than
# some machines have, but it works on node 20 (npm only warns).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}"
prefix="$cache/agents"
bin="$prefix/node_modules/.bin"
if [[ "${1:-}" == "--print" ]]; then echo "$bin"; exit 0; fi

log() { printf '[agents.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# installed_version PKG: the version npm left in node_modules, or nothing.
installed_version() {
  local manifest="$prefix/node_modules/$1/package.json"
  [[ -f "$manifest" ]] || return 0
  node -e 'process.stdout.write(String(require(process.argv[1]).version || ""))' "$manifest"
}

command -v npm >/dev/null || { log "npm not found: install Node.js (>= 20) first"; exit 1; }
mkdir -p "$prefix"

# "package@version" of every pinned agent asked for, and those not installed at their pin.
wanted=" $* "
pinned=()
missing=()
while read -r profile package version _; do
  [[ -z "$profile" || "$profile" == \#* ]] && continue
  [[ $# == 0 || "$wanted" == *" $profile "* ]] || continue
  pinned+=("$package@$version")
  have="$(installed_version "$package")"
  if [[ "$have" == "$version" ]]; then
    log "$package@$version already installed ($profile)"
  else
    log "$package@$version missing ($profile; had: ${have:-none})"
    missing+=("$package@$version")
  fi
done < "$here/agents.versions"
(( ${#pinned[@]} > 0 )) || { log "no agents pinned in $here/agents.versions for: ${*:-any profile}"; exit 1; }

if (( ${#missing[@]} > 0 )); then
  log "installing ${missing[*]} into $prefix"
  # --prefix keeps everything under the cache; a package.json there pins what is installed.
  npm install --no-audit --no-fund --save-exact --loglevel=error --prefix "$prefix" \
    "${pinned[@]}" >&2
  for spec in "${missing[@]}"; do
    package="${spec%@*}"
    have="$(installed_version "$package")"
    if [[ "$have" != "${spec##*@}" ]]; then
      log "install did not produce $spec (got: ${have:-none})"
      exit 1
    fi
  done
fi

echo "$bin"
