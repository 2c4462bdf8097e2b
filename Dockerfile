# The etcd-operator image (ghcr.io/etcd-operator/etcd-operator:<chart appVersion>): the
# `etcd-operator` binary on a distroless base, run as the non-root user the chart expects
# (65532). Build: `docker build -t ghcr.io/etcd-operator/etcd-operator:0.1.0 .`
# `tests/tests/helm_chart.rs` checks this file against the chart and the workspace.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
# etcd-client generates its gRPC code with protoc; .cargo/config.toml's default points at .tools/.
ENV PROTOC=/usr/bin/protoc
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p etcd-operator --bin etcd-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/etcd-operator /usr/local/bin/etcd-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/etcd-operator"]
CMD ["serve", "--help"]
