#!/usr/bin/env bash
# The e2e cluster: a real kube-apiserver/controller-manager/scheduler/etcd plus kwok, all local
# binaries started by `kwokctl --runtime binary` (nothing downloaded, no Docker). See e2e/README.md.
#
# Usage: e2e/cluster.sh up|down|env|status|restart-apiserver [SECONDS_DOWN]
#   up      build missing binaries (e2e/bin.sh), create the cluster if it is not already healthy,
#           add one Ready kwok node, wait for the default ServiceAccount, start the harness if
#           KANDEV_HARNESS_BIN is set; prints KUBECONFIG=<path> as its last line.
#           With KANDEV_NODE=real, also one real node (e2e/node.sh: containerd, kubelet,
#           kube-proxy, a local volume provisioner); the harness is then not started.
#   down    stop the harness and the real node (e2e/node.sh down, which checks that nothing of it
#           is left), delete the cluster, kill any leftover process started from the cluster
#           directory, remove the directory. Safe when nothing is up.
#   env     print `export KUBECONFIG=...`
#   status  print what runs; exit 0 only when the cluster answers and the node is Ready.
#   restart-apiserver [SECONDS_DOWN]
#           stop kube-apiserver, wait, start it again as it was (tests/e2e_faults.rs).
#
# Environment: KANDEV_CLUSTER (default kandev-e2e), KANDEV_CACHE (default ~/.cache/kandev-operator),
#   KANDEV_HARNESS_BIN (path of kandev-e2e-harness; started by `up` when set, not with a real node),
#   KANDEV_NODE (`real`: add the real node of e2e/node.sh; default: kwok only),
#   KANDEV_AGENTS (the agent profiles whose npm agents the harness's pods get, space-separated;
#   default: every one of e2e/agents.versions),
#   CARGO_TARGET_DIR (its debug/ dir is put first on PATH of kwok and the harness),
#   KANDEV_BIN_DIR (that directory instead, e.g. target/release for `make bench`),
#   KANDEV_AUDIT_POLICY (an audit policy file: kube-apiserver writes its audit log to
#   $KWOK_WORKDIR/clusters/<name>/logs/audit.log; `make bench` counts requests per client there).
# Every file lives in $KANDEV_CACHE/clusters/<name>/:
#   kubeconfig, kwok/ (KWOK_WORKDIR: kwokctl config, component logs, pids, etcd data, pki),
#   harness/ (the harness's local volumes and pod dirs), harness.pid, harness.log,
#   node/ (the real node's files, e2e/node.sh), node-mode (`real` when the cluster has one).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
name="${KANDEV_CLUSTER:-kandev-e2e}"
cache="${KANDEV_CACHE:-$HOME/.cache/kandev-operator}"
dir="$cache/clusters/$name"
kubeconfig="$dir/kubeconfig"
export KWOK_WORKDIR="$dir/kwok"
kwok_config="$KWOK_WORKDIR/kwok.yaml"
harness_pidfile="$dir/harness.pid"
harness_log="$dir/harness.log"
harness_link="/tmp/kandev-e2e-${name}"
node="kwok-node-0"
# KANDEV_NODE=real: the cluster also gets the real node of e2e/node.sh.
node_mode="${KANDEV_NODE:-kwok}"
[[ "$node_mode" == kwok || "$node_mode" == real ]] || { echo "KANDEV_NODE must be kwok or real" >&2; exit 2; }
node_mode_file="$dir/node-mode"
pki="$KWOK_WORKDIR/clusters/$name/pki"
# The ClusterIP of the `kubernetes` Service: the first of kube-apiserver's default
# --service-cluster-ip-range (10.0.0.0/24; kwokctl sets none). In-cluster clients dial it over
# TLS, so the serving certificate (kwokctl's admin.crt) carries it (kubeApiserverCertSANs below).
kubernetes_cluster_ip="10.0.0.1"
# Annotation set by the harness once a pod's process runs and its kwok Exec exists
# (must match HARNESS_PID_ANNOTATION in e2e/support/src/annotations.rs).
harness_annotation="e2e.kandev.dev/harness-pid"
# Pods the harness plays (any of these label selectors): agentctl pods, and the operator pods of
# the Helm chart (run as local processes with their ServiceAccount's token, see e2e/README.md).
played_labels=("kandev.dev/managed=true" "app.kubernetes.io/name=kandev-operator")

log() { printf '[cluster.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

bin="$("$here/bin.sh" --print)"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
# Our kubectl first (Debian's is 1.20); target/debug (or KANDEV_BIN_DIR) first of all so that
# kwok's exec and the harness find kandev-e2e-harness, kandev-operator and friends, even if built
# after `up`.
export PATH="${KANDEV_BIN_DIR:-$target_dir/debug}:$bin:$PATH"

kctl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

healthy() {
  [[ -f "$kubeconfig" && -x "$bin/kubectl" ]] || return 1
  kctl get --raw /readyz >/dev/null 2>&1 || return 1
  [[ "$(kctl get node "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == "True" ]]
}

# The cluster runs and was made for this KANDEV_NODE (a real node needs its own API server
# flags and certificate); with a real node, that node is Ready too.
healthy_for_mode() {
  healthy || return 1
  [[ "$(cat "$node_mode_file" 2>/dev/null || echo kwok)" == "$node_mode" ]] || return 1
  [[ "$node_mode" == kwok ]] || bash "$here/node.sh" status 2>/dev/null | grep -q " Ready"
}

harness_running() {
  [[ -f "$harness_pidfile" ]] && kill -0 "$(cat "$harness_pidfile")" 2>/dev/null
}

# kwok stages. Same behaviour as kwokctl's defaults (node-fast, pod-fast), with two changes:
#  * nodes report InternalIP = kwok's --node-ip (127.0.0.1), which the API server dials for exec;
#  * a pod the harness plays (labels: $played_labels) only becomes Running once the harness has
#    annotated it (process started, Exec in place), so Running means "exec reaches the process".
# Terminal pods are never moved back to Running (pod-ready only matches Pending pods).
write_kwok_config() {
  local node_conditions pod_running
  node_conditions='
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - type: {{ .type | Quote }}
        status: {{ .status | Quote }}
        reason: {{ .reason | Quote }}
        message: {{ .message | Quote }}
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}'
  pod_running='
      {{ $now := Now }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}'
  mkdir -p "$KWOK_WORKDIR"
  cat >"$kwok_config" <<EOF
# Written by e2e/cluster.sh; read by kwokctl (stages are passed on to kwok-controller).
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: kandev-node-initialize
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: NotIn, values: ['True']}
  next:
    statusTemplate: |
$node_conditions
      addresses:
      - {type: InternalIP, address: {{ NodeIP | Quote }}}
      - {type: Hostname, address: {{ .metadata.name | Quote }}}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ NodePort }}
      allocatable: {cpu: "640", memory: 2560Gi, ephemeral-storage: 10Pi, pods: "20000"}
      capacity: {cpu: "640", memory: 2560Gi, ephemeral-storage: 10Pi, pods: "20000"}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        bootID: ""
        machineID: ""
        systemUUID: ""
        osImage: kandev-e2e
        kernelVersion: {{ printf "kwok-%s" Version | Quote }}
        containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
        kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
        kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: kandev-node-heartbeat
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: '.status.phase', operator: In, values: [Running]}
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: In, values: ['True']}
  delay: {durationMilliseconds: 20000, jitterDurationMilliseconds: 25000}
  next:
    statusTemplate: |
$node_conditions
EOF
  # Pods nobody plays become Running at once; played pods once the harness annotated them.
  local label key value not_played=()
  for label in "${played_labels[@]}"; do
    key="${label%%=*}" value="${label#*=}"
    not_played+=("{key: '.metadata.labels[\"$key\"]', operator: NotIn, values: ['$value']}")
  done
  pod_ready_stage kandev-pod-ready "${not_played[@]}" >>"$kwok_config"
  for label in "${played_labels[@]}"; do
    key="${label%%=*}" value="${label#*=}"
    label="${key##*/}-$value"
    pod_ready_stage "kandev-pod-ready-${label//[^a-z0-9-]/-}" \
      "{key: '.metadata.labels[\"$key\"]', operator: In, values: ['$value']}" \
      "{key: '.metadata.annotations[\"$harness_annotation\"]', operator: Exists}" >>"$kwok_config"
  done
  # A deleted pod is removed (kwok deletes it with grace period 0). Not again once its grace
  # period is 0: kwok's own delete first sets it to 0 (an update kwok sees) and then removes the
  # pod, and playing the stage on that update deletes a pod that is gone; kwok retries a failed
  # delete, 404 included, with back-off for as long as it runs (a lost fleet of 400 pods kept
  # kwok busy with ~1,100 such deletes).
  cat >>"$kwok_config" <<EOF
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: kandev-pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
    - {key: '.metadata.deletionGracePeriodSeconds > 0', operator: In, values: ['true']}
  next:
    delete: true
EOF
}

# KANDEV_NODE=real: extra SANs of kwokctl's serving certificate (generated at create), read from
# the same --config file as the stages: the `kubernetes` Service's ClusterIP, which in-cluster
# clients dial (kube-rs and Go verify the IP SAN). kwokctl adds this host's addresses itself,
# among them the advertise address (the default route's), where kube-proxy sends the ClusterIP.
write_real_node_kwokctl_config() {
  cat >>"$kwok_config" <<EOF
---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  kubeApiserverCertSANs: [$kubernetes_cluster_ip]
EOF
}

# The `kubernetes` Service is what we expect: its ClusterIP in the serving certificate, its
# endpoint an address of this host.
check_kubernetes_service() {
  local ip endpoint
  ip="$(kctl get service kubernetes -n default -o 'jsonpath={.spec.clusterIP}')"
  [[ "$ip" == "$kubernetes_cluster_ip" ]] || die "the kubernetes Service has ClusterIP $ip, not $kubernetes_cluster_ip (update kubernetes_cluster_ip)"
  openssl x509 -in "$pki/admin.crt" -noout -ext subjectAltName | grep -qF "IP Address:$ip," ||
    openssl x509 -in "$pki/admin.crt" -noout -ext subjectAltName | grep -qE "IP Address:$ip\$" ||
    die "kwokctl's serving certificate $pki/admin.crt has no IP SAN $ip"
  endpoint="$(kctl get endpointslice -n default -l kubernetes.io/service-name=kubernetes -o 'jsonpath={.items[0].endpoints[0].addresses[0]}')"
  ip -4 -o addr show | grep -qF " inet $endpoint/" || die "the kubernetes Service's endpoint $endpoint is not an address of this host"
  log "kubernetes Service: $ip:443 -> $endpoint (an address of this host; $ip is in the serving certificate)"
}

# A kwok Stage that marks a Pending, not-yet-Ready pod Running ($pod_running, from the caller)
# when it also matches the matchExpressions given as arguments.
pod_ready_stage() {
  local name=$1 expr
  shift
  cat <<EOF
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: $name
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Pending]}
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: NotIn, values: ['True']}
EOF
  for expr in "$@"; do printf '    - %s\n' "$expr"; done
  printf '  next:\n    statusTemplate: |\n%s\n' "$pod_running"
}

start_harness() {
  [[ -n "${KANDEV_HARNESS_BIN:-}" ]] || return 0
  if [[ "$node_mode" == real ]]; then
    # It would play every agentctl pod, the real node's too (it does not look at nodeName).
    log "KANDEV_NODE=real: not starting the harness (the kubelet runs the pods)"
    return 0
  fi
  if harness_running; then
    if [[ "$KANDEV_HARNESS_BIN" -nt "$harness_pidfile" ]]; then
      log "harness binary rebuilt since the harness started: restarting it"
      stop_harness
    else
      log "harness already running (pid $(cat "$harness_pidfile"))"
      return 0
    fi
  fi
  [[ -x "$KANDEV_HARNESS_BIN" ]] || die "KANDEV_HARNESS_BIN=$KANDEV_HARNESS_BIN is not an executable"
  mkdir -p "$dir/harness"
  # Unix socket paths are limited to 108 bytes and agentctl's socket lives in a pod's emptyDir
  # under the state dir: give the harness a short path (a symlink) to its state.
  ln -sfn "$dir/harness" "$harness_link"
  # The harness's environment is the "image" of the pods it plays: the agents from npm on PATH,
  # and IS_SANDBOX=1 because claude-agent-acp refuses root (real pods run non-root).
  local agents
  # shellcheck disable=SC2086 # a list of profile names
  agents="$(bash "$here/agents.sh" ${KANDEV_AGENTS:-} | tail -n 1)"
  export PATH="$agents:$PATH" IS_SANDBOX=1
  log "starting harness $KANDEV_HARNESS_BIN (log: $harness_log)"
  # Own session: a Ctrl-C in the caller's terminal must not kill it behind `down`'s back.
  # (Not a process-group leader here, so setsid execs in place and $! is the harness's pid.)
  local selectors=() label
  for label in "${played_labels[@]}"; do selectors+=(--selector "$label"); done
  (cd "$dir/harness" && exec setsid "$KANDEV_HARNESS_BIN" run --kubeconfig "$kubeconfig" \
    --state-dir "$harness_link" "${selectors[@]}" </dev/null >>"$harness_log" 2>&1) &
  echo $! >"$harness_pidfile"
  local i
  for i in $(seq 1 100); do
    harness_running || { tail -n 20 "$harness_log" >&2; die "harness exited at start"; }
    grep -q "harness watching pods" "$harness_log" 2>/dev/null && break
    sleep 0.1
  done
  log "harness running (pid $(cat "$harness_pidfile"))"
}

stop_harness() {
  harness_running || { rm -f "$harness_pidfile"; return 0; }
  local pid i
  pid="$(cat "$harness_pidfile")"
  log "stopping harness (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$harness_pidfile"
}

# Pids of processes that belong to this cluster: started from (cwd), or naming (command line), the
# cluster directory. Excludes this script, its ancestors and its descendants (the scan itself).
ppid_of() { awk '{print $4}' "/proc/$1/stat" 2>/dev/null || echo 1; }
cluster_pids() {
  local self_chain=" $$ " p=$$ pid cwd q mine
  while [[ "$p" -gt 1 ]]; do
    p="$(ppid_of "$p")"
    self_chain+="$p "
  done
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    [[ "$self_chain" == *" $pid "* ]] && continue
    cwd="$(readlink "$d/cwd" 2>/dev/null || true)"
    if [[ "$cwd" == "$dir" || "$cwd" == "$dir/"* ]] || { tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null | grep -qF "$dir/"; then
      q="$pid" mine=0
      while [[ "$q" -gt 1 ]]; do
        [[ "$q" == "$$" ]] && { mine=1; break; }
        q="$(ppid_of "$q")"
      done
      [[ $mine == 1 ]] || echo "$pid"
    fi
  done
}

cmd_down() {
  # Everything kwokctl started, to wait for below (their pidfiles vanish with the delete).
  local known="" f
  for f in "$KWOK_WORKDIR/clusters/$name/pids/"*.pid; do
    [[ -f "$f" ]] && known+=" $(cat "$f")"
  done
  [[ -f "$harness_pidfile" ]] && known+=" $(cat "$harness_pidfile")"
  stop_harness
  # The real node first: it drains its pods through the API server. If it leaves anything
  # behind (check-clean), the control plane still goes, but the cluster directory stays.
  local node_ok=1
  if [[ -d "$dir/node" ]]; then
    bash "$here/node.sh" down || node_ok=0
  fi
  if [[ -d "$KWOK_WORKDIR/clusters/$name" && -x "$bin/kwokctl" ]]; then
    log "deleting kwok cluster $name"
    local out
    out="$("$bin/kwokctl" --name "$name" --config "$kwok_config" delete cluster --kubeconfig "$kubeconfig" 2>&1)" ||
      { printf '%s\n' "$out" >&2; log "kwokctl delete failed; killing what is left"; }
  fi
  local pids i
  pids="$(cluster_pids)"
  if [[ -n "$pids" ]]; then
    log "killing leftover processes: $(echo $pids)"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for i in $(seq 1 50); do [[ -z "$(cluster_pids)" ]] && break; sleep 0.1; done
    pids="$(cluster_pids)"
    # shellcheck disable=SC2086
    [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  fi
  pids="$(cluster_pids)"
  [[ -z "$pids" ]] || die "processes survived: $(echo $pids)"
  # kwokctl's components are orphans once kwokctl exits: PID 1 reaps them, here only lazily.
  # Wait (a bit) until they are gone from the process table, zombies included.
  local p left
  for i in $(seq 1 150); do
    left=""
    for p in $known; do [[ -e "/proc/$p" ]] && left+=" $p"; done
    [[ -z "$left" ]] && break
    sleep 0.1
  done
  [[ -z "$left" ]] || log "note: exited processes not yet reaped by PID 1 (zombies):$left"
  rm -f "$harness_link"
  if awk -v p="$dir" '$5 == p || index($5, p "/") == 1 {found=1} END {exit !found}' /proc/self/mountinfo; then
    die "mounts are left under $dir (see above): not removing it"
  fi
  # The node dir keeps what `node.sh down` needs to finish (the host's saved sysctls and paths).
  [[ $node_ok == 1 ]] || die "the real node left something behind (see above): $dir kept; run down again"
  rm -rf "$dir"
  log "cluster $name is down; no process left"
}

cmd_up() {
  local start=$SECONDS
  local set=core
  [[ "$node_mode" == real ]] && set=real
  bin="$("$here/bin.sh" "$set" | tail -n 1)"
  if healthy_for_mode; then
    log "cluster $name already up and healthy"
  else
    if [[ -d "$dir" ]]; then
      log "cluster $name exists but is not healthy (or not made for KANDEV_NODE=$node_mode): recreating"
      cmd_down
    fi
    mkdir -p "$dir"
    write_kwok_config
    # kwokctl 0.8 indexes its --extra-args by flag position, not by component: a component's
    # first --extra-args must come before a second component's second one, or it panics (index
    # out of range). So these follow the kwok-controller and kube-apiserver ones below.
    local real=()
    if [[ "$node_mode" == real ]]; then
      write_real_node_kwokctl_config
      # The API server calls the kubelet (exec, logs) with kwokctl's admin certificate, which the
      # kubelet authenticates against kwokctl's CA (e2e/node.sh).
      real=(--extra-args "kube-apiserver=kubelet-client-certificate=$pki/admin.crt"
        --extra-args "kube-apiserver=kubelet-client-key=$pki/admin.key"
        # kwokctl's binary runtime starts kwok-controller with --manage-all-nodes=true: it would
        # take the real node over (its status, its pods). Only nodes annotated as fake are kwok's.
        --extra-args kwok-controller=manage-all-nodes=false
        --extra-args kwok-controller=manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake)
    fi
    log "creating cluster $name (kwokctl --runtime binary, local binaries from $bin)"
    # Every component from $bin: a path that is not a URL is used from disk (symlinked into the
    # kwok workdir), so nothing is downloaded. KWOK_KUBECTL_BINARY too, for kwokctl's own kubectl.
    local audit=()
    # No rotation (kube-apiserver rotates at 100 MB by default; a sweep writes more): the bench
    # reads the one file from where it left off.
    [[ -n "${KANDEV_AUDIT_POLICY:-}" ]] && audit=(--kube-audit-policy "$KANDEV_AUDIT_POLICY"
      --extra-args kube-apiserver=audit-log-maxsize=1000000)
    KWOK_KUBECTL_BINARY="$bin/kubectl" "$bin/kwokctl" --name "$name" --config "$kwok_config" \
      create cluster --runtime binary "${audit[@]}" \
      --kubeconfig "$kubeconfig" \
      --etcd-binary "$bin/etcd" \
      --kube-apiserver-binary "$bin/kube-apiserver" \
      --kube-controller-manager-binary "$bin/kube-controller-manager" \
      --kube-scheduler-binary "$bin/kube-scheduler" \
      --kwok-controller-binary "$bin/kwok" \
      --enable-crds Exec,ClusterExec,Logs,ClusterLogs \
      --extra-args kwok-controller=node-ip=127.0.0.1 \
      --extra-args kube-apiserver=kubelet-preferred-address-types=InternalIP,Hostname \
      "${real[@]}" \
      --wait 3m >"$dir/kwokctl.log" 2>&1 ||
      { tail -n 20 "$dir/kwokctl.log" >&2; die "kwokctl create cluster failed (logs: $dir/kwokctl.log, $KWOK_WORKDIR/clusters/$name/logs)"; }
    if [[ -d "$KWOK_WORKDIR/cache" ]] && find "$KWOK_WORKDIR/cache" -path '*http*' | grep -q .; then
      die "kwokctl downloaded something: $(find "$KWOK_WORKDIR/cache" -path '*http*' | head -3)"
    fi
    log "cluster created in $((SECONDS - start))s; adding node $node"
    kctl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $node
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: $node
    kubernetes.io/role: agent
    node-role.kubernetes.io/agent: ""
EOF
    # The default StorageClass; the harness provisions its PVs (local directories), see
    # e2e/harness/provisioner.rs. Without a harness, PVCs stay Pending. With a real node,
    # kandev-local-provisioner (e2e/node/provisioner) provisions `local` PVs on that node.
    local provisioner=e2e.kandev.dev/harness
    [[ "$node_mode" == real ]] && provisioner=e2e.kandev.dev/real-node
    kctl apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: kandev-e2e
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: $provisioner
reclaimPolicy: Delete
volumeBindingMode: Immediate
EOF
    kctl wait --for=condition=Ready "node/$node" --timeout=120s >/dev/null || die "node $node not Ready"
    log "node $node Ready; waiting for the default ServiceAccount"
    echo "$node_mode" >"$node_mode_file"
  fi
  if [[ "$node_mode" == real ]]; then
    bash "$here/node.sh" up || die "the real node did not come up (e2e/node.sh; logs in $dir/node/logs)"
    check_kubernetes_service
  fi
  local i
  for i in $(seq 1 120); do
    kctl get serviceaccount default -n default >/dev/null 2>&1 && break
    [[ $i == 120 ]] && die "no default ServiceAccount after 60s (is kube-controller-manager up?)"
    sleep 0.5
  done
  start_harness
  log "cluster $name ready in $((SECONDS - start))s"
  echo "KUBECONFIG=$kubeconfig"
}

cmd_status() {
  local ok=0
  echo "cluster:    $name ($dir)"
  if [[ -d "$KWOK_WORKDIR/clusters/$name" ]]; then
    "$bin/kwokctl" --name "$name" --config "$kwok_config" get components 2>/dev/null || true
  else
    echo "not created"
    ok=1
  fi
  if healthy; then
    echo "apiserver:  $(kctl version -o json 2>/dev/null | grep -o '"gitVersion": *"[^"]*"' | tail -n 1)"
    echo "node:       $node Ready"
  else
    echo "apiserver/node: not healthy"
    ok=1
  fi
  if harness_running; then echo "harness:    pid $(cat "$harness_pidfile")"; else echo "harness:    not running"; fi
  if [[ -d "$dir/node" ]]; then
    echo "real node:"
    bash "$here/node.sh" status | sed 's/^/  /'
  fi
  echo "KUBECONFIG=$kubeconfig"
  return $ok
}

# Stops kube-apiserver (SIGTERM, as a rolling restart does), leaves it down for $1 seconds, and
# starts it again with the same command line, working directory and log, recording the new pid
# where kwokctl keeps it (so `down` stops it). Returns once /readyz answers and every other
# component runs: one that exited while the API server was away (kube-scheduler and
# kube-controller-manager exit when they lose their leader lease) is started again as it was, as
# the kubelet restarts a static pod, and has taken its leader lease again (until then nothing
# schedules pods or binds volumes), and the node is Ready.
alive() { [[ -e "/proc/$1" && "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]]; }
cmd_restart_apiserver() {
  local down="${1:-0}" pids="$KWOK_WORKDIR/clusters/$name/pids" logs="$KWOK_WORKDIR/clusters/$name/logs"
  [[ -f "$pids/kube-apiserver.pid" ]] || die "no kube-apiserver pid file in $pids (is the cluster up?)"
  # Every component's command line and directory, while they all run.
  local -A argv_of cwd_of
  local f component pid i
  for f in "$pids"/*.pid; do
    component="$(basename "$f" .pid)"
    pid="$(cat "$f")"
    alive "$pid" || die "$component (pid $pid) is not running"
    argv_of[$component]="$(tr '\0' '\n' <"/proc/$pid/cmdline")"
    cwd_of[$component]="$(readlink "/proc/$pid/cwd")"
  done
  start_component() {
    local -a argv
    mapfile -t argv <<<"${argv_of[$1]}"
    (cd "${cwd_of[$1]}" && exec setsid "${argv[@]}" >>"$logs/$1.log" 2>&1 </dev/null) &
    echo $! >"$pids/$1.pid"
  }
  # Who leads now, to know when a restarted component leads again.
  local -A holder_of
  for component in "${!argv_of[@]}"; do
    holder_of[$component]="$(lease_holder "$component")"
  done
  pid="$(cat "$pids/kube-apiserver.pid")"
  log "stopping kube-apiserver (pid $pid)"
  kill -TERM "$pid"
  for i in $(seq 1 900); do alive "$pid" || break; sleep 0.1; done
  alive "$pid" && die "kube-apiserver (pid $pid) did not stop within 90s"
  log "kube-apiserver stopped; starting it again in ${down}s"
  sleep "$down"
  start_component kube-apiserver
  log "started kube-apiserver again (pid $(cat "$pids/kube-apiserver.pid"))"
  for i in $(seq 1 600); do kctl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.1; done
  kctl get --raw /readyz >/dev/null 2>&1 || die "kube-apiserver not ready within 60s of its restart (see $logs/kube-apiserver.log)"
  log "kube-apiserver ready again"
  # Components that exit a little later (a lease's renew deadline) are caught too.
  sleep 2
  local -a restarted=()
  for component in "${!argv_of[@]}"; do
    [[ "$component" == kube-apiserver ]] && continue
    alive "$(cat "$pids/$component.pid")" && continue
    start_component "$component"
    restarted+=("$component")
    log "$component had exited while the API server was away; started it again (pid $(cat "$pids/$component.pid"))"
  done
  # A restarted leader waits out its predecessor's lease (15 s) before it works.
  for component in "${restarted[@]}"; do
    [[ -n "${holder_of[$component]:-}" ]] || continue
    for i in $(seq 1 900); do
      [[ "$(lease_holder "$component")" != "${holder_of[$component]}" ]] && break
      sleep 0.1
    done
    [[ "$(lease_holder "$component")" != "${holder_of[$component]}" ]] \
      || die "$component did not take its leader lease again within 90s (see $logs/$component.log)"
    log "$component leads again"
  done
  for i in $(seq 1 600); do healthy && break; sleep 0.1; done
  healthy || die "node $node not Ready within 60s of the restart"
}

# The holder of a component's leader lease in kube-system (empty when it has none).
lease_holder() {
  kctl -n kube-system get lease "$1" -o 'jsonpath={.spec.holderIdentity}' 2>/dev/null || true
}

case "${1:-}" in
  up) cmd_up ;;
  restart-apiserver) cmd_restart_apiserver "${2:-0}" ;;
  down) cmd_down ;;
  env) echo "export KUBECONFIG=$kubeconfig" ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|env|status|restart-apiserver [SECONDS_DOWN]" >&2; exit 2 ;;
esac
