#!/usr/bin/env bash
# The main job in one command (`make demo`): a local control plane, the Helm chart, a real agent
# session on a git repository that is lost and resumed lazily with the same resume token and the
# same worktree.
#
#   bash e2e/demo.sh [--keep]
#
# Builds what is missing (control plane from Go modules, the ACP agent from npm, our binaries),
# starts a kwok cluster named "kandev-demo" whose pods are played by local processes (the e2e
# harness), installs charts/kandev-operator, serves a small git repository with `git daemon` on
# loopback, creates docs/examples/tasksession.yaml with the real claude-agent-acp and that
# repository (spec.repository, branch kandev/fix-login), shows the cloned branch in the agent's
# workspace, deletes the agent's pod, shows needsResume and that nothing is relaunched, stops the
# git server (a resume never clones again), resumes with `kubectl kandev resume --wait`, and
# compares the resume token and the workspace's branch and HEAD before and after.
# Everything is torn down at the end (the git daemon too), also on failure or Ctrl-C, unless
# --keep (or KEEP=1) is given: then the cluster stays and its KUBECONFIG is printed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cd "$repo"
keep="${KEEP:-0}"
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--keep]" >&2; exit 2 ;;
  esac
done
export KANDEV_CLUSTER="${KANDEV_CLUSTER:-kandev-demo}"
ns=demo
session=fix-login
branch=kandev/fix-login
t0=$SECONDS
git_dir=""
git_pid=

bold=""; dim=""; reset=""
if [[ -t 1 ]]; then bold=$'\e[1m'; dim=$'\e[2m'; reset=$'\e[0m'; fi
step=0
say() { step=$((step + 1)); printf '\n%s== %d. %s%s\n' "$bold" "$step" "$*" "$reset"; }
note() { printf '%s   %s%s\n' "$dim" "$*" "$reset"; }
run() { printf '%s$ %s%s\n' "$bold" "$*" "$reset"; "$@"; }

stop_git_daemon() {
  if [[ -n "$git_pid" ]]; then
    kill "$git_pid" 2>/dev/null || true
    wait "$git_pid" 2>/dev/null || true
    git_pid=""
  fi
}

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  stop_git_daemon
  [[ -z "$git_dir" ]] || rm -rf "$git_dir"
  if [[ $keep == 1 && $rc == 0 ]]; then
    printf '\nThe cluster is still up. To look around:\n'
    printf '  export KUBECONFIG=%s PATH="%s:$PATH"\n' "$KUBECONFIG" "$PATH_ADD"
    printf '  kubectl get ts -n %s; kubectl kandev status %s -n %s\n' "$ns" "$session" "$ns"
    printf 'To stop it: KANDEV_CLUSTER=%s bash e2e/cluster.sh down\n' "$KANDEV_CLUSTER"
  else
    [[ $rc == 0 ]] || printf '\ndemo FAILED (exit %d); logs: ~/.cache/kandev-operator/clusters/%s/\n' "$rc" "$KANDEV_CLUSTER" >&2
    printf '\n== tearing down cluster %s\n' "$KANDEV_CLUSTER"
    bash "$here/cluster.sh" down || rc=$((rc == 0 ? 1 : rc))
  fi
  printf 'demo finished in %ds\n' "$((SECONDS - t0))"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "Tools: the Kubernetes control plane from Go modules, the ACP agent from npm (cached)"
note "first run on a fresh machine: the control plane build takes a while (progress below)"
# Only what the demo uses: the cluster's binaries and helm, and the claude-code agent (the
# test-only peers and the other agents are `make test`'s).
bin="$(bash "$here/bin.sh" core | tail -n 1)"
export KANDEV_AGENTS=claude-code
bash "$here/agents.sh" "$KANDEV_AGENTS" | tail -n 1 >/dev/null
run cargo build --locked --workspace --bins
PATH_ADD="${CARGO_TARGET_DIR:-$repo/target}/debug:$bin"
export PATH="$PATH_ADD:$PATH"

say "A local control plane: kube-apiserver, etcd, controller-manager, scheduler, kwok"
note "kwok plays the kubelet; the e2e harness runs each pod's container as a local process"
out="$(KANDEV_HARNESS_BIN="${CARGO_TARGET_DIR:-$repo/target}/debug/kandev-e2e-harness" bash "$here/cluster.sh" up)"
export KUBECONFIG="${out##*KUBECONFIG=}"
run kubectl get nodes

say "Install the operator with Helm (CRDs, least-privilege RBAC, 2 replicas with leader election)"
run helm install kandev-operator charts/kandev-operator \
  --namespace kandev-system --create-namespace --wait --timeout 3m
run kubectl -n kandev-system get deploy,pods -o wide
holder=""
for _ in $(seq 1 60); do
  holder="$(kubectl -n kandev-system get lease kandev-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)"
  [[ -n "$holder" ]] && break
  sleep 1
done
[[ -n "$holder" ]] || { echo "no operator replica became the leader" >&2; exit 1; }
note "leader: $holder (the other replica waits on the Lease)"

say "A git repository for the agent to work on, served by git daemon on loopback"
git_dir="$(mktemp -d "${TMPDIR:-/tmp}/kandev-demo-git.XXXXXX")"
{
  git init -q -b main "$git_dir/seed"
  printf '# login service\n' >"$git_dir/seed/README.md"
  printf 'export const redirect = "/home";\n' >"$git_dir/seed/login.js"
  git -C "$git_dir/seed" add .
  git -C "$git_dir/seed" -c user.name=demo -c user.email=demo@example.invalid commit -q -m "login service"
  git clone -q --bare "$git_dir/seed" "$git_dir/login.git"
} >/dev/null
port=""
for p in $(seq 19418 19518); do
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[[ -n "$port" ]] || { echo "no free port for git daemon in 19418-19518" >&2; exit 1; }
# git-daemon itself (not the `git` wrapper), so that its pid is the one to stop.
"$(git --exec-path)/git-daemon" --reuseaddr --export-all --listen=127.0.0.1 --port="$port" \
  --base-path="$git_dir" "$git_dir" >/dev/null 2>&1 &
git_pid=$!
for _ in $(seq 1 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.2
done
url="git://127.0.0.1:$port/login.git"
note "$url: main at $(git -C "$git_dir/seed" log --oneline -1)"

say "Create a TaskSession with a real ACP agent (claude-agent-acp from npm) on that repository"
run kubectl create namespace "$ns"
note "docs/examples/tasksession.yaml, plus spec.repository: {url: $url, branch: $branch}"
# The example with the repository added under spec: agentctl clones it into the empty workspace
# and creates the branch from the remote's default branch.
awk -v url="$url" -v branch="$branch" \
  '{print} /^spec:/ {print "  repository:"; print "    url: " url; print "    branch: " branch}' \
  docs/examples/tasksession.yaml | kubectl apply -n "$ns" -f -
run kubectl wait -n "$ns" "ts/$session" --for=jsonpath='{.status.state}'=WAITING_FOR_INPUT --timeout=180s
run kubectl get ts -n "$ns"
token_before="$(kubectl get er -n "$ns" "$session" -o jsonpath='{.status.resumeToken}')"
pod_before="$(kubectl get pods -n "$ns" -l "kandev.dev/session=$session" -o jsonpath='{.items[0].metadata.name}')"
note "agent pod: $pod_before"
note "resume token (the agent's ACP session id): $token_before"
run kubectl get er -n "$ns" "$session" -o jsonpath='{.status.worktree}{"\n"}'
note "the agent's workspace (its working directory) holds the clone; the demo adds a file, as the agent would:"
run kubectl exec -n "$ns" "$pod_before" -c agentctl -- git log --oneline --decorate -1
kubectl exec -n "$ns" "$pod_before" -c agentctl -- sh -c 'echo "redirect to the page the user came from" >NOTES.md'
run kubectl exec -n "$ns" "$pod_before" -c agentctl -- git status --short
workspace_before="$(kubectl exec -n "$ns" "$pod_before" -c agentctl -- sh -c 'git rev-parse --abbrev-ref HEAD; git rev-parse HEAD; git status --short')"

say "Lose the agent's pod (as a node drain or an eviction would)"
run kubectl delete pod -n "$ns" "$pod_before" --wait=true
run kubectl wait -n "$ns" "ts/$session" --for=jsonpath='{.status.needsResume}'=true --timeout=60s
run kubectl get ts -n "$ns"
run kubectl kandev status "$session" -n "$ns"

say "Lazy recovery: nothing is relaunched until someone asks"
sleep 5
run kubectl get pods -n "$ns" -l "kandev.dev/session=$session"
if [[ -n "$(kubectl get pods -n "$ns" -l "kandev.dev/session=$session" -o name)" ]]; then
  echo "a pod was relaunched without a resume request" >&2
  exit 1
fi

say "Stop the git server: a resume never clones again, the workspace volume has everything"
stop_git_daemon
note "git daemon stopped"

say "Resume: a new token in kandev.dev/resume-requested-at; the operator restores over ACP"
run kubectl kandev resume "$session" -n "$ns" --wait
run kubectl get ts -n "$ns"
token_after="$(kubectl get er -n "$ns" "$session" -o jsonpath='{.status.resumeToken}')"
state_after="$(kubectl get ts -n "$ns" "$session" -o jsonpath='{.status.state}')"
resumed="$(kubectl get ts -n "$ns" "$session" -o jsonpath='{.status.conditions[?(@.type=="Resumed")].message}')"
pod_after="$(kubectl get pods -n "$ns" -l "kandev.dev/session=$session" -o jsonpath='{.items[0].metadata.name}')"
note "new agent pod: $pod_after, on the same workspace volume"
run kubectl exec -n "$ns" "$pod_after" -c agentctl -- git log --oneline --decorate -1
run kubectl exec -n "$ns" "$pod_after" -c agentctl -- git status --short
workspace_after="$(kubectl exec -n "$ns" "$pod_after" -c agentctl -- sh -c 'git rev-parse --abbrev-ref HEAD; git rev-parse HEAD; git status --short')"

say "Result"
printf '   token before: %s\n   token after:  %s\n   state:        %s\n   restore:      %s\n' \
  "$token_before" "$token_after" "$state_after" "$resumed"
printf '   workspace before: %s\n   workspace after:  %s\n' \
  "$(echo $workspace_before)" "$(echo $workspace_after)"
if [[ "$token_before" == "$token_after" && "$state_after" == WAITING_FOR_INPUT \
  && "$workspace_before" == "$workspace_after" && "$workspace_before" == "$branch"$'\n'* ]]; then
  printf '%s   the session came back with the same resume token, on branch %s with its work%s\n' \
    "$bold" "$branch" "$reset"
else
  echo "the session did not come back as expected" >&2
  exit 1
fi

if [[ $keep != 1 ]]; then
  say "Clean up: sessions first (their finalizer needs the operator), then the chart"
  run kubectl delete namespace "$ns" --wait=true --timeout=120s
  run helm uninstall kandev-operator --namespace kandev-system --wait --timeout 2m
fi
