# syntax=docker/dockerfile:1
# Two images, static musl binaries, non-root:
#   docker build --target operator -t kandev/kandev-operator:0.1.0 .
#   docker build --target agentctl -t kandev/agentctl:0.1.0 .
# The Helm chart's defaults (image.repository, agentctlImage.repository) are these names, tagged
# with the chart's appVersion; tests/chart.rs keeps them in step.
#
# The agentctl image carries one ACP agent, chosen at build time (its launch command from
# src/agents/profiles.yaml must end up on PATH), e.g. Codex:
#   docker build --target agentctl --build-arg AGENT_PACKAGE=@zed-industries/codex-acp \
#     --build-arg AGENT_VERSION=<version> -t kandev/agentctl-codex:0.1.0 .
#
# Base images are pinned by version, not yet by digest: no container registry was reachable where
# this was written, so no digest could be resolved and checked. To pin one, append the digest of
# the tag, e.g. `crane digest rust:1.95.0-bookworm` → `FROM rust:1.95.0-bookworm@sha256:…`
# (tests/chart.rs accepts both forms and refuses floating tags). distroless has no version tags:
# static-debian12 pins the Debian release, :nonroot the user.

FROM rust:1.95.0-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# Cargo.toml names these test-only binaries; they are not built here.
COPY e2e/harness ./e2e/harness
COPY e2e/test_agent ./e2e/test_agent
COPY crds ./crds
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin kandev-operator --bin agentctl \
 && install -D target/x86_64-unknown-linux-musl/release/kandev-operator /out/kandev-operator \
 && install -D target/x86_64-unknown-linux-musl/release/agentctl /out/agentctl

# The operator: nothing but the binary on distroless static, user nonroot (65532).
FROM gcr.io/distroless/static-debian12:nonroot AS operator
COPY --from=build /out/kandev-operator /usr/local/bin/kandev-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kandev-operator"]

# agentctl pods: agentctl plus Node.js and one ACP agent from npm. The operator runs these pods as
# UID 1000 (the image's `node` user) with a read-only root filesystem, HOME on the workspace
# volume (<mountPath>/.kandev/home, where the agent's own session store survives the pod) and
# `agentctl serve --workspace … --profile <agent>` as the command; agentctl starts the agent's
# launch command from its profile (claude-code: `claude-agent-acp`).
FROM node:22.23.2-bookworm-slim AS agentctl
# Default agent: Claude Code over ACP, pinned to the version the protocol tests run (e2e/agents.sh).
ARG AGENT_PACKAGE=@agentclientprotocol/claude-agent-acp
ARG AGENT_VERSION=0.101.0
# git and certificates for agents that clone or fetch; tini is not needed: agentctl reaps its agent.
RUN apt-get update && apt-get install -y --no-install-recommends git ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && npm install --global --omit=dev --no-audit --no-fund "${AGENT_PACKAGE}@${AGENT_VERSION}" \
 && npm cache clean --force
COPY --from=build /out/agentctl /usr/local/bin/agentctl
ENV NODE_ENV=production
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["agentctl"]
