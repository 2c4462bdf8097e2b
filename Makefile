# etcd-operator: the two commands a fresh machine needs are `make run` and `make test`.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
# cargo-nextest runs every test in its own process; plain `cargo test` is the fallback.
TEST_RUNNER := $(shell $(CARGO) nextest --version >/dev/null 2>&1 && echo "nextest run" || echo test)

.PHONY: help run test test-kube robustness bench bench-fleet tools tools-etcd tools-protoc tools-kube tools-moto build install krew-archive fmt lint unit leftovers doc-test

help:
	@echo "make run    start etcd-operator locally (state in .local/)"
	@echo "make test   install the test components, then fmt, clippy and every test"
	@echo "make install  install etcd-operator and the kubectl plugin kubectl-etcd (cargo install)"
	@echo "make tools  install the pinned test components into .tools/ (idempotent)"
	@echo "make test-kube  the suite against a real kube-apiserver (KUBEBUILDER_ASSETS=DIR)"
	@echo "make robustness  the long robustness suite: random faults under load, then every check"
	@echo "                 (ROBUSTNESS_FAULTS=40, ROBUSTNESS_SEED=<n> replays a run, ROBUSTNESS_KINDS and"
	@echo "                 ROBUSTNESS_OPERATIONS limit what it does; docs/reliability.md)"
	@echo "make bench  run the benchmarks (release build) and print their figures"
	@echo "make bench-fleet  only the fleet benchmark (BENCH_CLUSTERS=100,1000), beside the base commit"

## Components (pinned, checksummed, into .tools/; see tools/install.sh)
tools:
	tools/install.sh
tools-etcd:
	tools/install.sh etcd
tools-protoc:
	tools/install.sh protoc
tools-kube:
	tools/install.sh kube
tools-moto:
	tools/install.sh moto

build: tools-protoc
	$(CARGO) build --workspace

## Both binaries into cargo's bin directory (~/.cargo/bin, or $CARGO_INSTALL_ROOT/bin):
## `etcd-operator`, and the kubectl plugin `kubectl-etcd` (kubectl runs it as `kubectl etcd` when
## it is on the PATH). The plugin alone needs no protoc: `cargo install --path kubectl-etcd`.
install: tools-protoc
	$(CARGO) install --locked --path operator
	$(CARGO) install --locked --path kubectl-etcd

## The archive plugins/krew/etcd.yaml points at, built here for Linux x86_64 (the one platform
## this project builds and tests on), with the SHA-256 to put in the manifest.
krew-archive:
	$(CARGO) build --locked --release -p kubectl-etcd
	mkdir -p dist
	tar -czf dist/kubectl-etcd_linux_amd64.tar.gz -C "$${CARGO_TARGET_DIR:-target}/release" kubectl-etcd
	sha256sum dist/kubectl-etcd_linux_amd64.tar.gz

## The main job on its embedded default: API server, controller and a backing etcd, all local.
run: tools-etcd tools-protoc
	$(CARGO) run -p etcd-operator --bin etcd-operator -- local --state-dir .local

## Everything CI checks, in order.
test: tools fmt lint unit leftovers doc-test

fmt:
	$(CARGO) fmt --all -- --check

lint: tools-protoc
	# No Result<_, String>, no error text searched outside etcd-errors/ (docs/architecture.md).
	.ci/check-errors
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The kube-apiserver suite is built only with its feature: linted (and so compiled) here too.
	$(CARGO) clippy -p etcd-operator-tests --all-targets --features kube-apiserver -- -D warnings

unit: tools
	$(CARGO) $(TEST_RUNNER) --workspace

# After the suite: no process a test started may still run (tests/tests/leftovers.rs).
leftovers: tools
	ETCD_OPERATOR_SUITE_FINISHED=1 $(CARGO) $(TEST_RUNNER) --workspace --test leftovers

doc-test: tools-protoc
	$(CARGO) test --workspace --doc

## The suite against a real kube-apiserver and kube-controller-manager, found through
## KUBEBUILDER_ASSETS (envtest's convention); without them every test fails saying how to get them.
test-kube: tools
	$(CARGO) $(TEST_RUNNER) -p etcd-operator-tests --features kube-apiserver --test kube_apiserver

## The long robustness suite (issue 26): seeded random faults and spec changes overlapped by faults
## against a local-mode cluster under recorded load, then the linearizability, watch, durability,
## HashKV and status checks; it prints its figures. The short variants run in `make test`.
robustness: tools
	if [ "$(TEST_RUNNER)" = "test" ]; then \
	  $(CARGO) test -p etcd-operator-tests --test robustness -- --ignored --nocapture --test-threads=1; \
	else \
	  $(CARGO) nextest run -p etcd-operator-tests --test robustness --run-ignored only --no-capture; \
	fi

## Benchmarks: print figures, each beside a baseline measured in the same run (never timed tests).
bench: tools
	$(CARGO) bench -p etcd-operator-apiserver --bench apiserver
	# Once more with the co-located controller on, as users run it (issue 24: both costs apart).
	BENCH_WITH_CONTROLLER=1 $(CARGO) bench -p etcd-operator-apiserver --bench apiserver
	$(CARGO) bench -p etcd-operator-tests --bench controller
	$(CARGO) bench -p etcd-operator-tests --bench upgrade
	$(CARGO) bench -p etcd-operator-tests --bench backup
	$(CARGO) bench -p etcd-operator-tests --bench snapshot_memory
	$(MAKE) bench-fleet

## The controller over a fleet of EtcdClusters (in-memory Kubernetes API, simulated etcd), beside
## the controller of the base commit 18d8eb5 built by tools/fleet-baseline.sh (into .bench/).
bench-fleet: tools-protoc
	baseline=$$(tools/fleet-baseline.sh); \
	BENCH_BASELINE_BINARY=$$baseline $(CARGO) bench -p etcd-operator-tests --bench fleet
