#!/usr/bin/env bash
# The e2e cluster's real node: containerd + runc + a CNI bridge + kubelet + kube-proxy + a local
# volume provisioner, on this machine, beside the kwok node. Started by
# `KANDEV_NODE=real e2e/cluster.sh up` once the control plane runs; see e2e/README.md "The real node".
#
# Usage: e2e/node.sh up|down|check-clean|import FILE...|images|status
#   up           install what is missing (apt-get), start containerd (its own config, root, state
#                and socket under the node dir), import the pause and probe images and
#                target/images/*.tar, start kubelet, kube-proxy and kandev-local-provisioner, wait
#                until the node is Ready. Idempotent: a running node is left alone.
#   down         cordon the node and delete its pods (the kubelet stops them through the CRI, which
#                tears their network down), stop every process `up` started, remove what is left
#                (containers, shims, mounts, netns, the bridge and veths, KUBE-/CNI- iptables
#                chains, cgroups), restore the sysctls and the root mount propagation, then run
#                check-clean. Safe when nothing is up.
#   check-clean  exit 1 listing whatever of the node is left on the host (processes, mounts under
#                the node dir, netns, the bridge, veths, iptables chains, cgroups, log links).
#   import FILE… import image archives (OCI or docker) into the node's containerd (namespace k8s.io).
#   images       build the pause and probe image archives (cached) and print their paths.
#   status       print what runs.
#
# Environment: KANDEV_CLUSTER, KANDEV_CACHE (as e2e/cluster.sh), KANDEV_NODE_NAME (default
#   real-node-0), KANDEV_NODE_POD_CIDR (default 10.244.0.0/24), KANDEV_NODE_BRIDGE (default kandev0).
# Files: $KANDEV_CACHE/clusters/<name>/node/ (configs, logs/, pids/, containerd root and state,
#   kubelet root, volumes/); images in $KANDEV_CACHE/node-images/.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
# shellcheck source=versions.env
source "$here/versions.env"
name="${KANDEV_CLUSTER:-kandev-e2e}"
cache="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}"
dir="$cache/clusters/$name"
nd="$dir/node"
kubeconfig="$dir/kubeconfig"
pki="$dir/kwok/clusters/$name/pki"
bin="$("$here/bin.sh" --print)"
node_name="${KANDEV_NODE_NAME:-real-node-0}"
pod_cidr="${KANDEV_NODE_POD_CIDR:-10.244.0.0/24}"
bridge="${KANDEV_NODE_BRIDGE:-kandev0}"
sock="$nd/containerd/containerd.sock"
cgroup_root="/kandev-$name"
# The StorageClass provisioner name that kandev-local-provisioner serves (cluster.sh's class).
provisioner_name="e2e.kandev.dev/real-node"
probe_image="docker.io/kandev/node-probe:e2e"
images_dir="$cache/node-images"
# Sysctls the kubelet (kernel tunables) and the CNI bridge (ip_forward) change: saved by `up`,
# restored by `down`.
sysctls=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
  kernel/keys/root_maxkeys kernel/keys/root_maxbytes net/ipv4/ip_forward)
components=(kube-proxy kubelet provisioner containerd) # the stop order

log() { printf '[node.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
kctl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
ctr_() { ctr --address "$sock" --namespace k8s.io "$@"; }

pid_of() { cat "$nd/pids/$1.pid" 2>/dev/null || true; }
running() {
  local pid
  pid="$(pid_of "$1")"
  [[ -n "$pid" && -e "/proc/$pid" && "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]
}

# start NAME CMD...: in its own session, log in logs/NAME.log, pid in pids/NAME.pid.
start() {
  local what=$1
  shift
  running "$what" && { log "$what already running (pid $(pid_of "$what"))"; return 0; }
  mkdir -p "$nd/logs" "$nd/pids"
  (cd "$nd" && exec setsid "$@" </dev/null >>"$nd/logs/$what.log" 2>&1) &
  echo $! >"$nd/pids/$what.pid"
  log "started $what (pid $!, log $nd/logs/$what.log)"
}

# wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.5 s; progress every 15 s.
wait_for() {
  local secs=$1 what=$2 start=$SECONDS next=15
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - start >= secs)) && return 1
    if ((SECONDS - start >= next)); then log "  still waiting for $what ($((SECONDS - start))s)"; next=$((next + 15)); fi
    sleep 0.5
  done
}

host_ip() { ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n 1; }

ensure_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/portmap && -x /usr/lib/cni/loopback ]] ||
    missing+=(containernetworking-plugins)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v gcc >/dev/null || missing+=(gcc libc6-dev)
  ((${#missing[@]} == 0)) && return 0
  log "installing ${missing[*]} (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >"$cache/node-apt.log" 2>&1 ||
    { DEBIAN_FRONTEND=noninteractive apt-get update >>"$cache/node-apt.log" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >>"$cache/node-apt.log" 2>&1; } ||
    die "apt-get install ${missing[*]} failed (log: $cache/node-apt.log)"
}

# --- images -----------------------------------------------------------------------------------

# docker_archive OUT REF ROOTFS ENTRYPOINT_JSON CMD_JSON: a one-layer docker-archive (what
# `docker save` writes; `ctr images import`, `podman load` and `kind load` read it).
docker_archive() {
  local out=$1 ref=$2 rootfs=$3 entrypoint=$4 cmd=$5 work diff config cfg_sha
  work="$(mktemp -d "$images_dir/.work.XXXXXX")"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$work/layer.tar" .
  diff="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
  mkdir "$work/$diff" && mv "$work/layer.tar" "$work/$diff/layer.tar"
  config="{\"architecture\":\"amd64\",\"os\":\"linux\",\"created\":\"1970-01-01T00:00:00Z\",\"config\":{\"Entrypoint\":$entrypoint,\"Cmd\":$cmd,\"Env\":[\"PATH=/\"],\"WorkingDir\":\"/\"},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$diff\"]},\"history\":[{\"created\":\"1970-01-01T00:00:00Z\",\"created_by\":\"e2e/node.sh images\"}]}"
  cfg_sha="$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)"
  printf '%s' "$config" >"$work/$cfg_sha.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cfg_sha" "$ref" "$diff" >"$work/manifest.json"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf "$out.tmp" manifest.json "$cfg_sha.json" "$diff"
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

# The pause image (registry.k8s.io/pause:<pinned>; no registry here) and the probe image (one
# static Go program, e2e/node/probe), rebuilt when their sources change.
cmd_images() {
  mkdir -p "$images_dir"
  local version rootfs
  version="$(sha256sum <"$here/node/pause.c" | cut -c1-16)-$PAUSE_IMAGE"
  if [[ ! -f "$images_dir/pause.tar" || "$(cat "$images_dir/.pause.version" 2>/dev/null)" != "$version" ]]; then
    log "building the pause image $PAUSE_IMAGE (gcc -static e2e/node/pause.c)"
    rootfs="$(mktemp -d "$images_dir/.rootfs.XXXXXX")"
    gcc -static -Os -o "$rootfs/pause" "$here/node/pause.c"
    strip "$rootfs/pause" 2>/dev/null || true
    docker_archive "$images_dir/pause.tar" "$PAUSE_IMAGE" "$rootfs" '["/pause"]' 'null'
    rm -rf "$rootfs"
    echo "$version" >"$images_dir/.pause.version"
  fi
  version="$(cat "$here/node/probe/go.mod" "$here/node/probe/main.go" | sha256sum | cut -c1-16)"
  if [[ ! -f "$images_dir/probe.tar" || "$(cat "$images_dir/.probe.version" 2>/dev/null)" != "$version" ]]; then
    log "building the probe image $probe_image (e2e/node/probe)"
    rootfs="$(mktemp -d "$images_dir/.rootfs.XXXXXX")"
    mkdir -p "$rootfs/tmp" "$rootfs/etc" && chmod 1777 "$rootfs/tmp"
    (cd "$here/node/probe" && GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS=-mod=mod \
      CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-s -w" -o "$rootfs/probe" .)
    docker_archive "$images_dir/probe.tar" "$probe_image" "$rootfs" '["/probe"]' '["sleep"]'
    rm -rf "$rootfs"
    echo "$version" >"$images_dir/.probe.version"
  fi
  echo "$images_dir/pause.tar"
  echo "$images_dir/probe.tar"
}

cmd_import() {
  (($# > 0)) || die "usage: $0 import FILE..."
  [[ -S "$sock" ]] || die "the node's containerd is not running ($sock)"
  local f
  for f in "$@"; do
    [[ -f "$f" ]] || die "no such file: $f"
    log "importing $f"
    ctr_ images import "$f" | sed 's/^/  /' >&2 ||
      die "ctr images import $f failed"
  done
}

# --- up ---------------------------------------------------------------------------------------

save_host_state() {
  [[ -f "$nd/host-state" ]] && return 0 # saved by the first `up`: keep the original values
  local k p
  {
    for k in "${sysctls[@]}"; do echo "sysctl $k $(cat "/proc/sys/$k")"; done
    echo "propagation $(findmnt -no PROPAGATION /)"
    # Host paths the kubelet or containerd create although configured elsewhere: removed by
    # `down` when they did not exist before.
    for p in /var/lib/kubelet /run/containerd /var/log/containers /var/run/netns /var/lib/cni; do
      [[ -e "$p" ]] || echo "created $p"
    done
  } >"$nd/host-state"
}

write_configs() {
  local ip=$1
  mkdir -p "$nd"/{containerd,cni/net.d,cni/ipam,kubelet/root,kubelet/pki,kubelet/pod-logs,volumes,logs,pids}
  cat >"$nd/containerd/config.toml" <<EOF
# Written by e2e/node.sh: the real node's containerd, nothing at the system's default paths.
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
oom_score = 0
[grpc]
  address = "$sock"
[ttrpc]
  address = "$nd/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$nd/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here: containers may not get a lower oom_score_adj than containerd's.
  restrict_oom_score_adj = true
  # Network namespaces under our state dir, not /var/run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$nd/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$nd/cni/net.d"
    max_conf_num = 1
EOF
  # One bridge; no masquerade (pods only talk to this host: the API server, the kubelet); the
  # CRI plugin sets up each pod's loopback itself (with /usr/lib/cni/loopback).
  cat >"$nd/cni/net.d/10-kandev.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kandev-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$nd/cni/ipam",
        "ranges": [[{"subnet": "$pod_cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # Pods get the host's non-loopback name servers (there is no cluster DNS).
  grep -E '^(nameserver|search|options)' /etc/resolv.conf | grep -vE 'nameserver (127\.|::1)' >"$nd/kubelet/resolv.conf" || true
  cat >"$nd/kubelet/config.yaml" <<EOF
# Written by e2e/node.sh.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine: cgroup v1 (hybrid), no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $cgroup_root
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
# The kubelet sets vm.overcommit_memory, kernel.panic and friends; node.sh down restores them.
protectKernelDefaults: false
containerRuntimeEndpoint: unix://$sock
imageServiceEndpoint: unix://$sock
resolvConf: $nd/kubelet/resolv.conf
clusterDomain: cluster.local
podLogsDir: $nd/kubelet/pod-logs
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# Images are imported, never pulled: never collect them; no disk-pressure eviction either (the
# disk of a test machine may well be 80% full).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
serializeImagePulls: false
maxPods: 110
registerNode: true
# No CAP_SYS_RESOURCE: the kubelet may not lower its own oom_score_adj (default -999).
oomScoreAdj: 0
# The API server authenticates with kwokctl's admin certificate (--kubelet-client-certificate):
# x509 against kwokctl's CA. Authorization Webhook, as on a real cluster: the kubelet asks the API
# server (SubjectAccessReview) and kwok-admin, in system:masters, may exec, read logs and
# metrics; any other certificate or token gets 403. Anonymous requests are refused.
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization:
  mode: Webhook
EOF
  cat >"$nd/kube-proxy.yaml" <<EOF
# Written by e2e/node.sh.
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $kubeconfig}
hostnameOverride: $node_name
mode: iptables
clusterCIDR: $pod_cidr
bindAddress: $ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the host's conntrack sysctls and route_localnet alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
EOF
}

make_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    h="${h%/}"
    [[ "$h" == */unified ]] && continue
    [[ -f "$h/cgroup.procs" ]] || continue
    mkdir -p "$h$cgroup_root"
    if [[ "$h" == */cpuset ]]; then
      [[ -s "$h$cgroup_root/cpuset.cpus" ]] || cat "$h/cpuset.cpus" >"$h$cgroup_root/cpuset.cpus"
      [[ -s "$h$cgroup_root/cpuset.mems" ]] || cat "$h/cpuset.mems" >"$h$cgroup_root/cpuset.mems"
    fi
  done
}

node_ready() {
  [[ "$(kctl get node "$node_name" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

cmd_up() {
  local start=$SECONDS ip server n
  [[ -f "$kubeconfig" && -f "$pki/ca.crt" ]] || die "no control plane ($kubeconfig, $pki): run KANDEV_NODE=real e2e/cluster.sh up"
  for n in kubelet kube-proxy kandev-local-provisioner kubectl; do
    [[ -x "$bin/$n" ]] || die "$bin/$n missing: run e2e/bin.sh real"
  done
  ensure_packages
  ip="$(host_ip)"
  [[ -n "$ip" ]] || die "no host IPv4 address (ip route get 1.1.1.1)"
  mkdir -p "$nd"
  save_host_state
  write_configs "$ip"
  # The kubelet's volume mounts must propagate (mount propagation of pods' volumes, and the
  # kubelet's own checks); the root is private here.
  [[ "$(findmnt -no PROPAGATION /)" == shared ]] || mount --make-rshared /
  make_cgroups
  cmd_images >/dev/null

  start containerd containerd --config "$nd/containerd/config.toml"
  wait_for 30 containerd ctr --address "$sock" version || die "containerd did not answer in 30s (log $nd/logs/containerd.log)"
  local f archives=("$images_dir/pause.tar" "$images_dir/probe.tar")
  for f in "$repo/target/images/kandev-operator.tar" "$repo/target/images/agentctl.tar"; do
    [[ -f "$f" ]] && archives+=("$f")
  done
  cmd_import "${archives[@]}"

  start kubelet "$bin/kubelet" --config "$nd/kubelet/config.yaml" --kubeconfig "$kubeconfig" \
    --root-dir "$nd/kubelet/root" --cert-dir "$nd/kubelet/pki" --hostname-override "$node_name" \
    --node-ip "$ip" --node-labels "kandev.dev/node=real" --v=2
  log "waiting for node $node_name to be Ready"
  wait_for 120 "node $node_name Ready" node_ready || { tail -n 30 "$nd/logs/kubelet.log" >&2; die "node $node_name not Ready in 120s (log $nd/logs/kubelet.log)"; }

  start kube-proxy "$bin/kube-proxy" --config "$nd/kube-proxy.yaml" --v=2
  wait_for 60 "kube-proxy's rules" iptables -t nat -n -L KUBE-SERVICES ||
    die "kube-proxy wrote no KUBE-SERVICES chain in 60s (log $nd/logs/kube-proxy.log)"

  server="$(kctl config view --raw -o 'jsonpath={.clusters[0].cluster.server}')"
  start provisioner "$bin/kandev-local-provisioner" -server "$server" -ca "$pki/ca.crt" \
    -cert "$pki/admin.crt" -key "$pki/admin.key" -provisioner "$provisioner_name" \
    -node "$node_name" -dir "$nd/volumes"
  wait_for 10 provisioner grep -q "watching claims" "$nd/logs/provisioner.log" || die "provisioner did not start (log $nd/logs/provisioner.log)"
  log "node $node_name Ready ($(kctl get node "$node_name" -o 'jsonpath={.status.nodeInfo.containerRuntimeVersion}'), IP $ip) in $((SECONDS - start))s"
}

# --- down -------------------------------------------------------------------------------------

stop_component() {
  local what=$1 pid
  running "$what" || { rm -f "$nd/pids/$what.pid"; return 0; }
  pid="$(pid_of "$what")"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do running "$what" || break; sleep 0.1; done
  running "$what" && { log "$what (pid $pid) ignored SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; sleep 0.2; }
  rm -f "$nd/pids/$what.pid"
  log "stopped $what (pid $pid)"
}

# Processes of the node: command line naming the node dir (containerd, shims, kubelet,
# kube-proxy, the provisioner), or in one of its cgroups (the containers).
node_pids() {
  local d pid
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    [[ "$pid" == "$$" || "$pid" == "$BASHPID" ]] && continue
    { tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null | grep -qF "$nd/" && echo "$pid"
  done
  cgroup_pids
}
cgroup_pids() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "${h%/}$cgroup_root" ]] || continue
    find "${h%/}$cgroup_root" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

tasks_running() { ctr_ tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING" {found=1} END {exit !found}'; }

cmd_down() {
  [[ -d "$nd" ]] || { log "no real node"; return 0; }
  local start=$SECONDS pids
  # Every step runs even if one fails; check-clean at the end says what is left.
  set +e
  # 1. Through the API: the kubelet stops the pods' containers and sandboxes (CNI DEL, netns).
  if running kubelet && kctl get --raw /readyz >/dev/null 2>&1; then
    log "draining $node_name: cordon, delete its pods"
    kctl cordon "$node_name" >/dev/null 2>&1 || true
    kctl delete pods --all-namespaces --field-selector "spec.nodeName=$node_name" \
      --grace-period=2 --wait=false >/dev/null 2>&1 || true
    wait_for 60 "the kubelet to stop the pods" eval '! tasks_running' ||
      log "pods still running after 60s: removing them below"
    log "  the kubelet stopped them in $((SECONDS - start))s"
  fi
  # 2. Our processes, kubelet first so that nothing is restarted.
  stop_component kube-proxy
  stop_component kubelet
  stop_component provisioner
  # 3. Whatever runs in containerd still: kill and delete the tasks and containers.
  if running containerd; then
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    for _ in $(seq 1 50); do tasks_running || break; sleep 0.1; done
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  stop_component containerd
  # 4. Leftovers: shims, containers' processes (their cgroups), all killed.
  pids="$(node_pids)"
  if [[ -n "$pids" ]]; then
    log "killing leftover processes: ${pids//$'\n'/ }"
    # shellcheck disable=SC2086 # a list of pids
    kill -KILL $pids 2>/dev/null || true
    for _ in $(seq 1 50); do [[ -z "$(node_pids)" ]] && break; sleep 0.1; done
  fi
  # 5. Mounts under the node dir (pods' volumes, rootfs overlays, shm, netns), deepest first.
  local m
  for _ in 1 2 3; do
    m="$(node_mounts)"
    [[ -z "$m" ]] && break
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done < <(sort -r <<<"$m")
  done
  # 6. Network: veths on our bridge (their netns are gone with the mounts), the bridge, iptables.
  if ip link show "$bridge" >/dev/null 2>&1; then
    for m in $(ip -o link show master "$bridge" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link delete "$m" 2>/dev/null || true
    done
    ip link delete "$bridge" 2>/dev/null || true
  fi
  if [[ -x "$bin/kube-proxy" ]]; then
    "$bin/kube-proxy" --cleanup >"$nd/logs/kube-proxy-cleanup.log" 2>&1 || true
  fi
  delete_chains
  # 7. cgroups, deepest first.
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "${h%/}$cgroup_root" ]] || continue
    find "${h%/}$cgroup_root" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # 8. The host as it was: sysctls, root propagation, paths created behind our back.
  restore_host_state
  set -e
  log "node $node_name down in $((SECONDS - start))s"
  cmd_check_clean
}

node_mounts() { awk -v p="$nd" '$5 == p || index($5, p "/") == 1 {print $5}' /proc/self/mountinfo; }

# KUBE-* (kube-proxy, the kubelet's canaries) and CNI-* (bridge, portmap) chains, with the rules
# that jump to them, in every table, IPv4 and IPv6.
our_chains() { "$1-save" -t "$2" 2>/dev/null | sed -n 's/^:\(\(KUBE\|CNI\)-[^ ]*\) .*/\1/p'; }
delete_chains() {
  local cmd table chain rule
  for cmd in iptables ip6tables; do
    command -v "$cmd" >/dev/null || continue
    for table in filter nat mangle raw; do
      [[ -n "$(our_chains "$cmd" "$table")" ]] || continue
      # Rules of built-in chains that jump to ours.
      { "$cmd-save" -t "$table" | grep -E '^-A [A-Z]+ .*-j (KUBE|CNI)-' | grep -vE '^-A (KUBE|CNI)-' || true; } |
        while read -r rule; do eval "$cmd -t $table -D ${rule#-A }" 2>/dev/null || true; done
      for chain in $(our_chains "$cmd" "$table"); do "$cmd" -t "$table" -F "$chain" 2>/dev/null || true; done
      for chain in $(our_chains "$cmd" "$table"); do "$cmd" -t "$table" -X "$chain" 2>/dev/null || true; done
    done
  done
  # kube-proxy's nftables tables (it cleans them up at start in iptables mode; none expected).
  if command -v nft >/dev/null; then
    local family
    for family in ip ip6; do nft delete table "$family" kube-proxy 2>/dev/null || true; done
  fi
}

restore_host_state() {
  [[ -f "$nd/host-state" ]] || return 0
  local kind key value
  while read -r kind key value; do
    case "$kind" in
      sysctl) [[ "$(cat "/proc/sys/$key")" == "$value" ]] || echo "$value" >"/proc/sys/$key" ;;
      propagation) [[ "$key" == private ]] && mount --make-rprivate / ;;
      created)
        case "$key" in
          /var/log/containers) find "$key" -maxdepth 1 -type l -lname "$nd/*" -delete 2>/dev/null || true
            rmdir "$key" 2>/dev/null || true ;;
          *) # /run/netns is bind-mounted onto itself (shared) by whoever makes it first.
            while mountpoint -q "$key" 2>/dev/null; do umount "$key" 2>/dev/null || umount -l "$key" || break; done
            if [[ -d "$key" ]]; then rm -rf --one-file-system "$key"; fi ;;
        esac ;;
    esac
  done <"$nd/host-state"
}

# --- check-clean ------------------------------------------------------------------------------

cmd_check_clean() {
  local left=() p
  p="$(node_pids | tr '\n' ' ')"
  [[ -n "${p// /}" ]] && left+=("processes: $p")
  p="$(node_mounts | tr '\n' ' ')"
  [[ -n "${p// /}" ]] && left+=("mounts: $p")
  ip link show "$bridge" >/dev/null 2>&1 && left+=("interface $bridge")
  # veths on our bridge, or on no bridge at all (ours once the bridge is gone); podman's, say,
  # are on its own bridge.
  p="$(ip -o link show type veth 2>/dev/null | awk -v b="$bridge" '{
    name = $2; sub(/@.*/, "", name); sub(/:$/, "", name); master = ""
    for (i = 3; i < NF; i++) if ($i == "master") master = $(i + 1)
    if (master == "" || master == b) printf "%s ", name }')"
  [[ -n "${p// /}" ]] && left+=("veths: $p")
  local cmd table
  for cmd in iptables ip6tables; do
    command -v "$cmd" >/dev/null || continue
    for table in filter nat mangle raw; do
      p="$(our_chains "$cmd" "$table" | tr '\n' ' ')"
      [[ -n "${p// /}" ]] && left+=("$cmd -t $table chains: $p")
    done
  done
  for p in /sys/fs/cgroup/*"$cgroup_root"; do [[ -d "$p" ]] && left+=("cgroup $p"); done
  p="$( (find /var/log/containers -maxdepth 1 -type l -lname "$nd/*" 2>/dev/null || true) | tr "\n" " ")"
  [[ -n "${p// /}" ]] && left+=("log links: $p")
  if [[ -f "$nd/host-state" ]]; then
    local kind key value
    while read -r kind key value; do
      [[ "$kind" == sysctl && "$(cat "/proc/sys/$key")" != "$value" ]] && left+=("sysctl $key=$(cat "/proc/sys/$key") (was $value)")
      [[ "$kind" == propagation && "$(findmnt -no PROPAGATION /)" != "$key" ]] && left+=("/ propagation $(findmnt -no PROPAGATION /) (was $key)")
      [[ "$kind" == created && -e "$key" ]] && left+=("$key (created by up)")
    done <"$nd/host-state"
  fi
  if ((${#left[@]})); then
    log "LEFT BEHIND by the real node:"
    printf '  %s\n' "${left[@]}" >&2
    return 1
  fi
  log "check-clean: nothing of the real node is left"
}

cmd_status() {
  local c
  for c in "${components[@]}"; do
    if running "$c"; then echo "$c: pid $(pid_of "$c")"; else echo "$c: not running"; fi
  done
  if [[ -f "$kubeconfig" ]]; then kctl get node "$node_name" -o wide 2>/dev/null || true; fi
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  check-clean) cmd_check_clean ;;
  import) shift; cmd_import "$@" ;;
  images) cmd_images ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|check-clean|import FILE...|images|status" >&2; exit 2 ;;
esac
