#!/usr/bin/env bash
# Builds the test control plane from Go modules, once, cached outside the repo:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes),
#   etcd (go.etcd.io/etcd/server/v3), kwok, kwokctl (sigs.k8s.io/kwok), helm (helm.sh/helm/v3),
#   agent-sandbox-controller with its Sandbox CRD (sigs.k8s.io/agent-sandbox, for make bench),
#   toxiproxy-server (github.com/Shopify/toxiproxy/v2, the fault proxy of tests/e2e_faults.rs),
#   jaeger-all-in-one (github.com/jaegertracing/jaeger, the OTLP receiver of tests/e2e_tracing.rs),
#   kandev-apiproxy (e2e/apiproxy: the HTTP fault proxy of tests/e2e_faults.rs, ours) and
#   kandev-kstatus (e2e/kstatus: kstatus's verdict, from sigs.k8s.io/cli-utils, for
#   tests/e2e_gitops.rs, ours), and Flux's Kustomization and HelmRelease CRDs (from the
#   kustomize-controller and helm-controller modules, into flux-crds/ beside bin/, for the same);
#   for the real node (e2e/node.sh): kubelet and kube-proxy (k8s.io/kubernetes, the same wrapper
#   module) and kandev-local-provisioner (e2e/node/provisioner, ours).
# Usage: e2e/bin.sh [SET]         build what SET needs and is missing, print the bin directory on
#                                  the last line. SET: `core` (a cluster and helm: etcd, the four
#                                  Kubernetes commands, kwok, kwokctl, helm; what `make demo`,
#                                  `cluster.sh up` and `make chart` need) or `all` (the default:
#                                  core and the test-only peers agent-sandbox, toxiproxy, jaeger
#                                  kandev-apiproxy and kandev-kstatus, for `make e2e` and
#                                  `make bench`) or
#                                  `real` (core, kubelet, kube-proxy and kandev-local-provisioner:
#                                  what `KANDEV_NODE=real cluster.sh up` needs)
#        e2e/bin.sh --print        only print the bin directory
#        e2e/bin.sh --list [SET]   only print the names of SET's binaries, one a line
# Cache: $KANDEV_CACHE (default ~/.cache/kandev-operator). A warm run takes seconds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}"
bin="$cache/k8s-${K8S_VERSION}/bin"
if [[ "${1:-}" == "--print" ]]; then echo "$bin"; exit 0; fi
core_bins=(etcd kwok kwokctl helm kube-apiserver kube-controller-manager kube-scheduler kubectl)
test_bins=(agent-sandbox-controller toxiproxy-server jaeger-all-in-one kandev-apiproxy kandev-kstatus)
real_bins=(kubelet kube-proxy kandev-local-provisioner)
list=0
if [[ "${1:-}" == "--list" ]]; then list=1; shift; fi
set_name="${1:-all}"
case "$set_name" in
  core) wanted=("${core_bins[@]}") ;;
  all) wanted=("${core_bins[@]}" "${test_bins[@]}") ;;
  real) wanted=("${core_bins[@]}" "${real_bins[@]}") ;;
  *) echo "e2e/bin.sh: unknown set '$set_name' (core, all or real)" >&2; exit 2 ;;
esac
if (( list )); then printf '%s\n' "${wanted[@]}"; exit 0; fi

export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$bin"
mkdir -p "$bin" "$cache/src"

log() { printf '[bin.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Runs a long command with a heartbeat so a cold build does not look hung.
with_progress() {
  local what="$1"; shift
  local start=$SECONDS logf="$cache/src/build-$what.log"
  "$@" >"$logf" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30
    kill -0 "$pid" 2>/dev/null && log "  $what: still building ($((SECONDS - start))s, $(grep -c . "$logf" || true) log lines)"
  done
  if ! wait "$pid"; then
    log "  $what: FAILED, last lines of $logf:"; tail -n 30 "$logf" >&2; return 1
  fi
  log "  $what: done in $((SECONDS - start))s"
}

have() { # have NAME VERSION: binary exists and was built from this version
  [[ -x "$bin/$1" && "$(cat "$bin/.$1.version" 2>/dev/null)" == "$2" ]]
}
stamp() { echo "$2" >"$bin/.$1.version"; }

# The version stamps of every Kubernetes command (what `kubectl version` and the node report).
k8s_ldflags() {
  local p minor ldflags="-s -w"
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ldflags+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ldflags"
}

build_kubernetes() {
  local names=(kube-apiserver kube-controller-manager kube-scheduler kubectl) missing=0 n
  for n in "${names[@]}"; do have "$n" "$K8S_VERSION" || missing=1; done
  [[ $missing == 0 ]] && return 0
  log "building ${names[*]} $K8S_VERSION from k8s.io/kubernetes (cold: 20-40 min on 2 cores)"
  local dir="$cache/src/kubernetes-$K8S_VERSION" staging="v0${K8S_VERSION#v1}"
  mkdir -p "$dir"
  # kubernetes' go.mod points its staging modules at ./staging/...; a wrapper module replaces
  # each of them with the published k8s.io/<name> at the matching v0.x version.
  local gomod
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module kandev.dev/k8s-build"
    echo
    grep -E '^go [0-9]' "$gomod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } >"$dir/go.mod"
  log "  wrapper module: $(grep -c '^replace' "$dir/go.mod") staging modules replaced at $staging"
  (cd "$dir" && with_progress kubernetes go build -trimpath -ldflags "$(k8s_ldflags)" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  for n in "${names[@]}"; do stamp "$n" "$K8S_VERSION"; done
}

build_etcd() {
  have etcd "$ETCD_VERSION" && return 0
  log "building etcd $ETCD_VERSION from go.etcd.io/etcd/server/v3"
  local dir="$cache/src/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  printf 'module kandev.dev/etcd-build\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$dir/go.mod"
  (cd "$dir" && with_progress etcd go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
  stamp etcd "$ETCD_VERSION"
}

# agent-sandbox's go.mod has no replace lines: a wrapper module that requires it builds its
# controller. Its CRDs come from the same module, into <bin>/../agent-sandbox-crds.
build_agent_sandbox() {
  local crds="$bin/../agent-sandbox-crds"
  have agent-sandbox-controller "$AGENT_SANDBOX_VERSION" && [[ -d "$crds" ]] && return 0
  log "building agent-sandbox-controller $AGENT_SANDBOX_VERSION from sigs.k8s.io/agent-sandbox"
  local dir="$cache/src/agent-sandbox-$AGENT_SANDBOX_VERSION" mod="sigs.k8s.io/agent-sandbox"
  mkdir -p "$dir"
  printf 'module kandev.dev/agent-sandbox-build\n\ngo 1.26.0\n\nrequire %s %s\n' "$mod" "$AGENT_SANDBOX_VERSION" >"$dir/go.mod"
  (cd "$dir" && with_progress agent-sandbox go build -trimpath -ldflags "-s -w" \
    -o "$bin/agent-sandbox-controller" "$mod/cmd/agent-sandbox-controller")
  local src
  src="$(cd "$dir" && go mod download -json "$mod@$AGENT_SANDBOX_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  rm -rf "$crds" && mkdir -p "$crds"
  cp "$src/k8s/crds/agents.x-k8s.io_sandboxes.yaml" "$crds/"
  chmod u+w "$crds"/*.yaml
  stamp agent-sandbox-controller "$AGENT_SANDBOX_VERSION"
}

build_installable() { # build_installable NAME MODULE/PATH VERSION
  have "$1" "$3" && return 0
  log "building $1 $3 (go install $2)"
  with_progress "$1" go install -trimpath -ldflags "-s -w" "$2@$3"
  stamp "$1" "$3"
}

# toxiproxy's server command is named `server`; installed under its own name.
build_toxiproxy() {
  have toxiproxy-server "$TOXIPROXY_VERSION" && return 0
  log "building toxiproxy-server $TOXIPROXY_VERSION from github.com/Shopify/toxiproxy/v2"
  local tmp="$cache/src/toxiproxy-$TOXIPROXY_VERSION"
  mkdir -p "$tmp"
  GOBIN="$tmp" with_progress toxiproxy go install -trimpath -ldflags "-s -w" \
    "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
  mv "$tmp/server" "$bin/toxiproxy-server"
  stamp toxiproxy-server "$TOXIPROXY_VERSION"
}

# Jaeger's go.mod has a replace line, so `go install` refuses it: a wrapper module that requires
# it (with the same replace) builds cmd/all-in-one (cold: a few minutes on 2 cores).
build_jaeger() {
  have jaeger-all-in-one "$JAEGER_VERSION" && return 0
  log "building jaeger-all-in-one $JAEGER_VERSION from github.com/jaegertracing/jaeger"
  local dir="$cache/src/jaeger-$JAEGER_VERSION" mod="github.com/jaegertracing/jaeger" gomod
  mkdir -p "$dir"
  gomod="$(go mod download -json "$mod@$JAEGER_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    printf 'module kandev.dev/jaeger-build\n\n'
    grep -E '^go [0-9]' "$gomod"
    printf '\nrequire %s %s\n\n' "$mod" "$JAEGER_VERSION"
    grep -E '^replace ' "$gomod" || true
  } >"$dir/go.mod"
  (cd "$dir" && with_progress jaeger go build -trimpath -ldflags "-s -w" \
    -o "$bin/jaeger-all-in-one" "$mod/cmd/all-in-one")
  stamp jaeger-all-in-one "$JAEGER_VERSION"
}

# Our own HTTP fault proxy (e2e/apiproxy, standard library only): stamped by its source's hash.
build_apiproxy() {
  local src="$here/apiproxy" version
  version="$(cat "$src/go.mod" "$src/main.go" | sha256sum | cut -c1-16)"
  have kandev-apiproxy "$version" && return 0
  log "building kandev-apiproxy from e2e/apiproxy"
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$bin/kandev-apiproxy" .)
  stamp kandev-apiproxy "$version"
}

# kstatus's verdict on JSON objects (e2e/kstatus, over sigs.k8s.io/cli-utils, the library
# Flux's health checks use): stamped by its source's hash.
build_kstatus() {
  local src="$here/kstatus" version
  version="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)"
  have kandev-kstatus "$version" && return 0
  log "building kandev-kstatus from e2e/kstatus (sigs.k8s.io/cli-utils)"
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$bin/kandev-kstatus" .)
  stamp kandev-kstatus "$version"
}

# Flux's Kustomization and HelmRelease CRDs, copied from their controllers' Go modules (nothing
# is built) into flux-crds/ beside the bin directory.
fetch_flux_crds() {
  local crds="$bin/../flux-crds"
  local version="$FLUX_KUSTOMIZE_CONTROLLER_VERSION $FLUX_HELM_CONTROLLER_VERSION"
  [[ "$(cat "$crds/.version" 2>/dev/null)" == "$version" ]] && return 0
  log "fetching Flux's CRDs (kustomize-controller $FLUX_KUSTOMIZE_CONTROLLER_VERSION, helm-controller $FLUX_HELM_CONTROLLER_VERSION)"
  rm -rf "$crds" && mkdir -p "$crds"
  local mod dir
  for mod in "github.com/fluxcd/kustomize-controller@$FLUX_KUSTOMIZE_CONTROLLER_VERSION" \
    "github.com/fluxcd/helm-controller@$FLUX_HELM_CONTROLLER_VERSION"; do
    dir="$(go mod download -json "$mod" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    [[ -n "$dir" ]] || { log "cannot download $mod"; return 1; }
    cp "$dir"/config/crd/bases/*.yaml "$crds/"
  done
  chmod u+w "$crds"/*.yaml
  echo "$version" >"$crds/.version"
}

# The real node's kubelet and kube-proxy, from the wrapper module that build_kubernetes wrote
# (run first), stamped and versioned like the other Kubernetes commands. CGO_ENABLED=0 as for
# the rest: upstream builds kubelet static too; nothing of ours needs cgo (no cadvisor libpfm,
# no cgo DNS).
build_kubernetes_node() {
  local names=(kubelet kube-proxy) missing=0 n
  for n in "${names[@]}"; do have "$n" "$K8S_VERSION" || missing=1; done
  [[ $missing == 0 ]] && return 0
  local dir="$cache/src/kubernetes-$K8S_VERSION"
  [[ -f "$dir/go.mod" ]] || { log "no wrapper module in $dir (build_kubernetes first)"; return 1; }
  log "building ${names[*]} $K8S_VERSION from k8s.io/kubernetes (warm cache: a few minutes)"
  (cd "$dir" && with_progress kubernetes-node go build -trimpath -ldflags "$(k8s_ldflags)" -o "$bin/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  for n in "${names[@]}"; do stamp "$n" "$K8S_VERSION"; done
}

# The real node's PersistentVolume provisioner (e2e/node/provisioner, standard library only):
# stamped by its source's hash.
build_local_provisioner() {
  local src="$here/node/provisioner" version
  version="$(cat "$src/go.mod" "$src/main.go" | sha256sum | cut -c1-16)"
  have kandev-local-provisioner "$version" && return 0
  log "building kandev-local-provisioner from e2e/node/provisioner"
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$bin/kandev-local-provisioner" .)
  stamp kandev-local-provisioner "$version"
}

total=$SECONDS
build_etcd
build_installable kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
build_installable kwokctl sigs.k8s.io/kwok/cmd/kwokctl "$KWOK_VERSION"
build_installable helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
build_kubernetes
if [[ "$set_name" == all ]]; then
  build_agent_sandbox
  build_toxiproxy
  build_jaeger
  build_apiproxy
  build_kstatus
  fetch_flux_crds
fi
if [[ "$set_name" == real ]]; then
  build_kubernetes_node
  build_local_provisioner
fi
log "binaries ($set_name) ready in $((SECONDS - total))s"
echo "$bin"
