# syntax=docker/dockerfile:1
# Two images, non-root; `make images` builds both with docker, podman or buildah (e2e/images.sh):
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
# cc-debian12 pins the Debian release, :nonroot the user. Where no registry serves these bases,
# e2e/images.sh makes local stand-ins of exactly these references (and says so).
#
# The build stage compiles for x86_64-unknown-linux-gnu, not musl: the same Debian 12 glibc as both
# runtime bases, and no extra Rust target to download.

# Labels of both images (OCI annotations); `make images` passes the version and the commit.
ARG VERSION=0.1.0
ARG REVISION=unknown

FROM rust:1.95.0-bookworm AS build
# Names this stage's image, which no tag keeps, so that e2e/images.sh can remove the old ones.
LABEL dev.kandev.stage="build"
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The workspace's test crates (e2e/*) are not built here, but Cargo loads their manifests.
COPY e2e ./e2e
COPY crds ./crds
# The caches (crates and the target dir) make a rebuild incremental.
RUN --mount=type=cache,target=/usr/local/cargo/registry,id=kandev-cargo-registry \
    --mount=type=cache,target=/src/target,id=kandev-cargo-target \
    cargo build --release --locked --bin kandev-operator --bin agentctl \
 && install -D target/release/kandev-operator /out/kandev-operator \
 && install -D target/release/agentctl /out/agentctl

# The operator: the binary on distroless cc (glibc, libgcc, CA certificates; no shell), user nonroot
# (65532).
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title="kandev-operator" \
      org.opencontainers.image.source="https://github.com/kandev/kandev-operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
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
# It is installed with `npm ci` from AGENT_LOCK's package.json and package-lock.json: the agent and
# every package it pulls in at the versions and integrity hashes of the lockfile, nothing newer.
# For another agent, make its directory (package.json naming it, then
# `npm install --package-lock-only`) and pass AGENT_LOCK, AGENT_PACKAGE and AGENT_VERSION.
ARG AGENT_LOCK=images/agentctl/claude-code
ARG AGENT_PACKAGE=@agentclientprotocol/claude-agent-acp
ARG AGENT_VERSION=0.101.0
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title="agentctl" \
      org.opencontainers.image.source="https://github.com/kandev/kandev-operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      dev.kandev.agent.package="${AGENT_PACKAGE}" \
      dev.kandev.agent.version="${AGENT_VERSION}"
COPY ${AGENT_LOCK}/package.json ${AGENT_LOCK}/package-lock.json /opt/agent/
# git and certificates for agents that clone or fetch; tini is not needed: agentctl reaps its agent.
RUN apt-get update && apt-get install -y --no-install-recommends git ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && cd /opt/agent && npm ci --omit=dev --no-audit --no-fund \
 && node -e 'const v = require(process.argv[1] + "/package.json").version; if (v !== process.argv[2]) { console.error(process.argv[1] + " " + v + " is not AGENT_VERSION " + process.argv[2]); process.exit(1) }' \
      "/opt/agent/node_modules/${AGENT_PACKAGE}" "${AGENT_VERSION}" \
 && ln -s /opt/agent/node_modules/.bin/* /usr/local/bin/ \
 && npm cache clean --force
COPY --from=build /out/agentctl /usr/local/bin/agentctl
ENV NODE_ENV=production
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["agentctl"]
