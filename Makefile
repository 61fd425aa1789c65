# kandev-operator — the two commands a newcomer needs:
#   make demo   the main job: local control plane, Helm chart, a real agent session lost and resumed
#   make test   every test: lint, unit, chart, protocol, end-to-end on a real control plane (kwok nodes, then
#               a real kubelet node with the images built from the Dockerfile), bench smoke
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: demo test disk lint unit chart protocol agents-smoke e2e images e2e-real bench bench-smoke bench-idle fuzz bins agents crds dist cluster-up cluster-down help

help:
	@echo "make demo          run the lose-and-resume demo on a local control plane (KEEP=1 keeps it)"
	@echo "make test          lint + unit + chart + protocol + end-to-end tests + bench smoke (builds the control plane once, cached)"
	@echo "make unit          only the fast tier (no cluster, no npm)"
	@echo "make chart         helm lint + helm template checks of charts/kandev-operator (builds helm once, cached)"
	@echo "make protocol      ACP client and agentctl against real npm agents (installs them once, cached)"
	@echo "make agents-smoke  every pinned npm agent (e2e/agents.versions) answers its profile's initialize"
	@echo "make e2e           only the end-to-end tier (starts and tears down a local cluster)"
	@echo "make images        both Dockerfile images with docker, podman or buildah, as archives + SBOMs in target/images"
	@echo "make e2e-real      the chart, the images and a real agent on a real kubelet node (containerd; needs root)"
	@echo "make bench         the fleet benchmark: ours beside the API floor and agent-sandbox (BENCH_N, BENCH_SWEEP, …)"
	@echo "make bench-idle    the idle-fleet benchmark: 10,000 sessions in their steady state (BENCH_IDLE_FLEET)"
	@echo "make fuzz          the cargo-fuzz targets in fuzz/, FUZZ_SECONDS (60) each (nightly + cargo-fuzz)"
	@echo "make bins          build the control-plane binaries into ~/.cache/kandev-operator"
	@echo "make crds          regenerate crds/ and the chart's CRD templates from the Rust types"
	@echo "make manifests     regenerate deploy/install.yaml from the chart"
	@echo "make dist          the kubectl plugin's release archives (target/dist) and krew manifest (plugins/kandev.yaml)"
	@echo "make cluster-up    start a local cluster and keep it (make cluster-down stops it)"

# KEEP=1 leaves the demo cluster running and prints its KUBECONFIG.
demo:
	bash e2e/demo.sh $(if $(filter 1,$(KEEP)),--keep,)

test: disk lint unit chart protocol e2e e2e-real bench-smoke

# Bounds the Cargo target dir (KANDEV_TARGET_CAP_GIB) and stops early when the disk is too full
# for a run (KANDEV_MIN_FREE_GIB).
disk:
	bash e2e/disk.sh

# The workspace lints (Cargo.toml: no unsafe code without an allow that says why, no unwrap or
# expect outside tests) under clippy, then cargo-deny (deny.toml: bans, licenses, sources),
# installed once into ~/.cache/kandev-operator/cargo-tools.
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	tools="$$(bash e2e/cargo-tool.sh cargo-deny 0.20.2 | tail -n 1)" && \
	  PATH="$$tools:$$PATH" $(CARGO) deny --workspace --locked check bans licenses sources

# Every crate's tests; the agentctl tests run the scriptable test agent, a crate of its own.
unit:
	$(CARGO) build --locked -p kandev-test-agent
	$(CARGO) test --workspace --locked

# The Helm chart: lint, render with defaults and with the optional parts, then the tests marked
# #[ignore = "chart: …"] (RBAC == REQUIRED_PERMISSIONS, Deployment defaults, the alerts' and the
# dashboard's PromQL against the operator's metrics, values schema).
chart:
	helm="$$(bash e2e/bin.sh core | tail -n 1)/helm" && \
	  "$$helm" lint --strict charts/kandev-operator && \
	  "$$helm" lint --strict charts/kandev-operator --set metrics.serviceMonitor.enabled=true \
	    --set metrics.prometheusRule.enabled=true --set metrics.dashboard.enabled=true \
	    --set-json 'agentProfiles={"my-agent":{"launch":["my-agent","--acp"]}}' && \
	  "$$helm" template kandev-operator charts/kandev-operator -n kandev-system --kube-version 1.36.0 >/dev/null && \
	  "$$helm" template kandev-operator charts/kandev-operator -n kandev-system --kube-version 1.36.0 \
	    --set metrics.serviceMonitor.enabled=true \
	    --set metrics.prometheusRule.enabled=true --set metrics.dashboard.enabled=true \
	    --set-json 'agentProfiles={"my-agent":{"launch":["my-agent","--acp"]}}' >/dev/null && \
	  KANDEV_HELM="$$helm" $(CARGO) test --locked --test chart -- --ignored
	@bash deploy/render.sh | diff -u deploy/install.yaml - >/dev/null || \
	  { echo "deploy/install.yaml differs from the chart: run 'make manifests'"; exit 1; }

# The tests marked #[ignore = "protocol: …"] need the real agents that e2e/agents.sh installs
# (the versions pinned in e2e/agents.versions); agents_smoke starts every one of them.
protocol:
	$(CARGO) build --locked -p kandev-test-agent
	agents="$$(bash e2e/agents.sh | tail -n 1)" && \
	  KANDEV_CLAUDE_AGENT_ACP="$$agents/claude-agent-acp" KANDEV_AGENTS_BIN="$$agents" \
	  $(CARGO) test --locked --test 'protocol_*' --test 'agentctl_*' --test agents_smoke -- --ignored

# Only the smoke test of the pinned agents (part of `protocol`): each profile's launch command
# answers initialize, advertises what docs/agent-profiles.md says, and session/new works offline
# or answers auth-required.
agents-smoke:
	agents="$$(bash e2e/agents.sh | tail -n 1)" && \
	  KANDEV_AGENTS_BIN="$$agents" $(CARGO) test --locked --test agents_smoke -- --ignored

agents:
	bash e2e/agents.sh

e2e:
	bash e2e/test.sh

# target/images/{kandev-operator,agentctl}.tar (+ .spdx.json), built from the Dockerfile; where no
# registry serves its base images, from local stand-ins of them (see e2e/images.sh).
images:
	bash e2e/images.sh

# The real-node tier (tests/real_node.rs): its own cluster with a real kubelet, torn down at the end.
e2e-real: images
	bash e2e/real.sh

# The fleet benchmark (docs/performance.md): its own cluster, torn down at the end. Not part of
# `make test` (minutes, not seconds), except its smoke below.
bench:
	bash e2e/bench/run.sh

bench-idle:
	BENCH_IDLE_FLEET=$${BENCH_IDLE_FLEET:-10000} bash e2e/bench/run.sh

# 5 sessions through every phase of ours but idle (a storm of resume tokens and an idle suspension included), the floor (alone and with the write
# budget) and agent-sandbox: proves the bench still runs and measures (fails on an unfinished phase, uncounted in-pod
# operations, an empty audit count, or a session the operator's watchdog counts as stuck).
bench-smoke:
	env -u BENCH_SWEEP -u BENCH_IDLE_FLEET BENCH_PROFILE=dev BENCH_N=5 BENCH_PHASES=launch,loss,resume,storm,suspend BENCH_OUT=target/bench-smoke \
	  BENCH_CONTENDERS=ours,floor,floor-budget,agent-sandbox bash e2e/bench/run.sh --require-complete

# Not part of `make test`: needs a nightly toolchain and `cargo install cargo-fuzz`.
fuzz:
	for target in line_codec jsonrpc_line history; do \
	  cargo +nightly fuzz run $$target -- -max_total_time=$${FUZZ_SECONDS:-60} || exit 1; \
	done

bins:
	bash e2e/bin.sh

# Every copy of the CRDs: crds/ and the chart's templates (tests/crd_drift.rs checks both).
crds:
	$(CARGO) run --quiet --bin kandev-operator -- crd --output-dir crds \
	  --chart-dir charts/kandev-operator/templates/crds

# deploy/install.yaml: the chart rendered for installs without Helm (`make chart` checks drift).
manifests:
	bash deploy/render.sh > deploy/install.yaml.tmp && mv deploy/install.yaml.tmp deploy/install.yaml

# The kubectl plugin's release archives for krew (linux/darwin × amd64/arm64, those this machine
# can build; the others are named with the reason), SHA256SUMS, plugins/kandev.yaml with their
# sha256, checked by krew's validator, a krew install of the archive and tests/krew_manifest.rs.
dist:
	bash plugins/dist.sh

cluster-up:
	$(CARGO) build --bins
	KANDEV_HARNESS_BIN=$${CARGO_TARGET_DIR:-$(CURDIR)/target}/debug/kandev-e2e-harness bash e2e/cluster.sh up

cluster-down:
	bash e2e/cluster.sh down
