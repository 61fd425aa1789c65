#!/usr/bin/env bash
# Installs the real ACP agents the protocol tests talk to, pinned, from npm, cached outside the
# repo so `cargo clean` or a fresh clone does not pay for the download again.
#   e2e/agents.sh           install what is missing, print the bin directory on the last line
#   e2e/agents.sh --print   only print the bin directory
# Cache: $KANDEV_CACHE (default ~/.cache/kandev-operator)/agents. A warm run takes about a second:
# the pinned version is read from the installed package.json, npm is not started at all.
#
# Notes for running the agents (see DESIGN.md §6 "Known agent quirks"): claude-agent-acp refuses
# to start a session as root unless IS_SANDBOX=1; its engines field asks for a newer node than
# some machines have, but it works on node 20 (npm only warns).
set -euo pipefail

# Pinned: tests assert exact error codes, which have changed between agent releases.
CLAUDE_AGENT_ACP_PKG="@agentclientprotocol/claude-agent-acp"
CLAUDE_AGENT_ACP_VERSION="0.101.0"

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

have="$(installed_version "$CLAUDE_AGENT_ACP_PKG")"
if [[ "$have" == "$CLAUDE_AGENT_ACP_VERSION" && -x "$bin/claude-agent-acp" ]]; then
  log "$CLAUDE_AGENT_ACP_PKG@$CLAUDE_AGENT_ACP_VERSION already installed"
else
  log "installing $CLAUDE_AGENT_ACP_PKG@$CLAUDE_AGENT_ACP_VERSION into $prefix (had: ${have:-none})"
  # --prefix keeps everything under the cache; a package.json there pins what is installed.
  npm install --no-audit --no-fund --save-exact --loglevel=error --prefix "$prefix" \
    "$CLAUDE_AGENT_ACP_PKG@$CLAUDE_AGENT_ACP_VERSION" >&2
  have="$(installed_version "$CLAUDE_AGENT_ACP_PKG")"
  if [[ "$have" != "$CLAUDE_AGENT_ACP_VERSION" || ! -x "$bin/claude-agent-acp" ]]; then
    log "install did not produce $bin/claude-agent-acp at $CLAUDE_AGENT_ACP_VERSION (got: ${have:-none})"
    exit 1
  fi
fi

echo "$bin"
