#!/usr/bin/env bash
# `make dist`: release archives of the kubectl plugin for krew, and its manifest.
#
#   bash plugins/dist.sh            build, archive, write plugins/kandev.yaml, validate, test
#
# For each of linux/amd64, linux/arm64, darwin/amd64, darwin/arm64 that this machine can build
# (the target's Rust standard library is installed and a linker for it is found), builds
# `kubectl-kandev` in release mode and packs target/dist/kubectl-kandev_<tag>_<os>_<arch>.tar.gz
# with the binary, LICENSE and README.md (reproducibly: sorted, owner 0, the commit's time).
# Platforms it cannot build are named with the reason and left out of the manifest.
# Then: target/dist/SHA256SUMS, plugins/kandev.yaml with the archives' sha256, krew's own
# validator (validate-krew-manifest, built from the Go module sigs.k8s.io/krew when Go is there)
# installing each archive of this machine's platform, and tests/krew_manifest.rs comparing the
# manifest with the archives.
#
# Environment:
#   DIST_BASE_URL   where the archives are published [https://github.com/kandev/kandev-operator/releases/download/<tag>]
#   DIST_SKIP_KREW  1: do not build or run krew's validator
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cd "$repo"
log() { printf '[dist.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
[[ -n "$version" ]] || { log "no version in Cargo.toml"; exit 1; }
tag="v$version"
base_url="${DIST_BASE_URL:-https://github.com/kandev/kandev-operator/releases/download/$tag}"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
out="$target_dir/dist"
cache="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}"
krew_version="v0.4.3"

host="$(rustc -vV | sed -n 's/^host: //p')"
sysroot="$(rustc --print sysroot)"
# The commit's time: the same sources give the same archive.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

# os/arch -> Rust target
declare -A triples=(
  [linux/amd64]=x86_64-unknown-linux-gnu
  [linux/arm64]=aarch64-unknown-linux-gnu
  [darwin/amd64]=x86_64-apple-darwin
  [darwin/arm64]=aarch64-apple-darwin
)
platforms=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64)

# Why a platform cannot be built here, or nothing.
cannot_build() {
  local triple="$1" var
  [[ "$triple" == "$host" ]] && return 0
  if [[ ! -d "$sysroot/lib/rustlib/$triple/lib" ]]; then
    echo "the Rust standard library for $triple is not installed (rustup target add $triple needs the Rust distribution server, which this machine cannot reach)"
    return 0
  fi
  var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_LINKER"
  if [[ -n "${!var:-}" ]]; then
    return 0
  fi
  case "$triple" in
    *-linux-gnu)
      command -v "${triple%%-*}-linux-gnu-gcc" >/dev/null ||
        echo "no linker for $triple (install gcc-${triple%%-*}-linux-gnu or set $var)" ;;
    *-apple-darwin)
      echo "no linker for $triple (needs the macOS SDK, e.g. osxcross; set $var)" ;;
  esac
}

rm -rf "$out"
mkdir -p "$out"
built=()
for platform in "${platforms[@]}"; do
  triple="${triples[$platform]}"
  why="$(cannot_build "$triple")"
  if [[ -n "$why" ]]; then
    log "skipping $platform: $why"
    continue
  fi
  log "building $platform ($triple)"
  cargo build --release --locked --bin kubectl-kandev --target "$triple"
  os="${platform%/*}" arch="${platform#*/}"
  name="kubectl-kandev_${tag}_${os}_${arch}"
  stage="$(mktemp -d)"
  cp "$target_dir/$triple/release/kubectl-kandev" "$stage/kubectl-kandev"
  cp LICENSE README.md "$stage/"
  chmod 0755 "$stage/kubectl-kandev"
  chmod 0644 "$stage/LICENSE" "$stage/README.md"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    -C "$stage" -cf - kubectl-kandev LICENSE README.md | gzip -n -9 >"$out/$name.tar.gz"
  rm -rf "$stage"
  built+=("$platform")
done
[[ ${#built[@]} -gt 0 ]] || { log "no platform could be built"; exit 1; }
(cd "$out" && sha256sum -- *.tar.gz >SHA256SUMS)
log "archives and SHA256SUMS in $out:"
cat "$out/SHA256SUMS" >&2

# The manifest: every platform built, with its archive's sha256.
manifest="$here/kandev.yaml"
{
  cat <<EOF
# krew manifest of the kubectl plugin, written by \`make dist\` (plugins/dist.sh): the platforms
# built on the machine that ran it, with their archives' sha256. tests/krew_manifest.rs checks it.
# Install from the archives of \`make dist\`:
#   kubectl krew install --manifest=plugins/kandev.yaml --archive=target/dist/kubectl-kandev_${tag}_linux_amd64.tar.gz
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: kandev
spec:
  version: ${tag}
  homepage: https://github.com/kandev/kandev-operator
  shortDescription: Inspect, resume and prompt kandev AI coding-agent sessions
  description: |
    kubectl kandev works with the TaskSessions of the kandev operator, which keeps AI
    coding-agent sessions (Claude Code, Codex, Gemini and others speaking ACP) alive across
    pod loss. It shows whether a session needs a resume and why (status), asks the operator to
    resume it and waits for the outcome (resume --wait), sends a prompt and streams the
    agent's answer (prompt), prints the recorded conversation (history), lists and answers
    the agent's permission requests that wait for a person (permissions, approve, deny), and
    ends sessions (complete, cancel). Objects print with -o json, yaml or jsonpath=; kubectl's --namespace,
    --context, --as, --as-group, --token and --request-timeout work as in kubectl.
  caveats: |
    The kandev operator and its CRDs must be installed in the cluster.
    Shell completion through kubectl's own (kubectl >= 1.26): link the plugin as its
    completion executable next to it:
      ln -s kubectl-kandev "\${KREW_ROOT:-\$HOME/.krew}/bin/kubectl_complete-kandev"
  platforms:
EOF
  for platform in "${built[@]}"; do
    os="${platform%/*}" arch="${platform#*/}"
    name="kubectl-kandev_${tag}_${os}_${arch}.tar.gz"
    sum="$(sha256sum "$out/$name" | cut -d' ' -f1)"
    cat <<EOF
    - selector:
        matchLabels:
          os: ${os}
          arch: ${arch}
      uri: ${base_url}/${name}
      sha256: ${sum}
      bin: kubectl-kandev
      files:
        - from: kubectl-kandev
          to: .
        - from: LICENSE
          to: .
        - from: README.md
          to: .
EOF
  done
} >"$manifest.tmp"
mv "$manifest.tmp" "$manifest"
log "wrote $manifest (${built[*]})"

# krew itself: its validator checks the manifest's schema and selectors, then `krew install
# --manifest --archive` installs this machine's archive into a scratch KREW_ROOT (krew checks
# the sha256), and the installed plugin runs.
if [[ "${DIST_SKIP_KREW:-0}" != 1 ]] && command -v go >/dev/null; then
  krew_bin="$cache/krew-$krew_version/bin"
  if [[ ! -x "$krew_bin/validate-krew-manifest" || ! -x "$krew_bin/krew" ]]; then
    log "building krew $krew_version and validate-krew-manifest from Go modules (once)"
    mkdir -p "$krew_bin"
    GOBIN="$krew_bin" go install "sigs.k8s.io/krew/cmd/validate-krew-manifest@$krew_version" \
      "sigs.k8s.io/krew/cmd/krew@$krew_version"
  fi
  "$krew_bin/validate-krew-manifest" -manifest "$manifest" -skip-install
  case "$(uname -s)/$(uname -m)" in
    Linux/x86_64) host_platform=linux/amd64 ;;
    Linux/aarch64) host_platform=linux/arm64 ;;
    Darwin/x86_64) host_platform=darwin/amd64 ;;
    Darwin/arm64) host_platform=darwin/arm64 ;;
    *) host_platform="" ;;
  esac
  archive="$out/kubectl-kandev_${tag}_${host_platform%/*}_${host_platform#*/}.tar.gz"
  if [[ -n "$host_platform" && -f "$archive" ]]; then
    krew_root="$(mktemp -d)"
    log "krew install --manifest --archive $archive (KREW_ROOT=$krew_root)"
    KREW_ROOT="$krew_root" "$krew_bin/krew" install --manifest="$manifest" --archive="$archive" </dev/null
    installed="$("$krew_root/bin/kubectl-kandev" --version)"
    [[ "$installed" == "kubectl-kandev $version" ]] ||
      { log "the installed plugin says ${installed@Q}, not kubectl-kandev $version"; exit 1; }
    ls "$krew_root/store/kandev/$tag/LICENSE" >/dev/null
    log "installed by krew: $installed"
    rm -rf "$krew_root"
  fi
fi

KANDEV_DIST="$out" cargo test --locked --test krew_manifest -- --include-ignored
log "done: ${built[*]} built; see $out"
