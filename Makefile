# kandev-operator — the two commands a newcomer needs:
#   make demo   the main job on a local control plane (lands with the shipping issue)
#   make test   every test: lint, unit, protocol and end-to-end on a real control plane
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: demo test lint unit protocol e2e bins agents crds cluster-up cluster-down help

help:
	@echo "make demo          run the lose-and-resume demo on a local control plane"
	@echo "make test          lint + unit tests + end-to-end tests (builds the control plane once, cached)"
	@echo "make unit          only the fast tier (no cluster, no npm)"
	@echo "make protocol      ACP client and agentctl against real npm agents (installs them once, cached)"
	@echo "make e2e           only the end-to-end tier (starts and tears down a local cluster)"
	@echo "make bins          build the control-plane binaries into ~/.cache/kandev-operator"
	@echo "make crds          regenerate crds/ from the Rust types"
	@echo "make cluster-up    start a local cluster and keep it (make cluster-down stops it)"

demo:
	@echo "make demo: not yet available — the one-command demo lands with the shipping issue."
	@echo "Meanwhile: 'make test' runs everything, 'make cluster-up' gives you a local cluster."

test: lint unit protocol e2e

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets --locked -- -D warnings

unit:
	$(CARGO) test --locked

# The tests marked #[ignore = "protocol: …"] need the real agents that e2e/agents.sh installs.
protocol:
	agents="$$(bash e2e/agents.sh | tail -n 1)" && \
	  KANDEV_CLAUDE_AGENT_ACP="$$agents/claude-agent-acp" \
	  $(CARGO) test --locked --test 'protocol_*' --test 'agentctl_*' -- --ignored

agents:
	bash e2e/agents.sh

e2e:
	bash e2e/test.sh

bins:
	bash e2e/bin.sh

crds:
	$(CARGO) run --quiet --bin kandev-operator -- crd --output-dir crds

cluster-up:
	$(CARGO) build --bins
	KANDEV_HARNESS_BIN=$(CURDIR)/target/debug/kandev-e2e-harness bash e2e/cluster.sh up

cluster-down:
	bash e2e/cluster.sh down
