# syntax=docker/dockerfile:1
# Static binaries on a minimal, non-root base.
#   docker build --target operator -t kandev-operator .

FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY e2e/harness ./e2e/harness
COPY crds ./crds
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin kandev-operator \
 && install -D target/x86_64-unknown-linux-musl/release/kandev-operator /out/kandev-operator

FROM gcr.io/distroless/static-debian12:nonroot AS operator
COPY --from=build /out/kandev-operator /usr/local/bin/kandev-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kandev-operator"]
