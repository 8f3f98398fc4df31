# kube-dispatch: the two commands are `make demo` and `make test`; the rest is for developers.
# Every target builds or installs what it needs and reuses what is already built.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CLUSTER := tests/cluster/cluster.sh
CARGO ?= cargo

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ printf "  make %-14s %s\n", $$1, $$2 }'

.PHONY: demo
demo: ## Run kube-dispatch on a local control plane (KEEP=1 leaves it running)
	@tests/demo.sh

.PHONY: test
test: ## Everything CI checks: versions, fmt, clippy, all tests against a real API server
	@tests/run-tests.sh

.PHONY: bench-core
bench-core: ## Micro-benchmark of the dispatch core (requests/s per core, bytes per key)
	$(CARGO) bench -p kube-dispatch-dispatcher --bench dispatch_core

.PHONY: binaries
binaries: ## Build (once) kube-apiserver, kube-controller-manager, kubectl and etcd
	@tests/cluster/build-binaries.sh

.PHONY: cluster-up
cluster-up: ## Start (or reuse) the local control plane; prints the kubeconfig path
	@$(CLUSTER) up

.PHONY: cluster-down
cluster-down: ## Stop the local control plane; leaves no process or port behind
	@$(CLUSTER) down

.PHONY: cluster-status
cluster-status: ## Say whether the local control plane is running
	@$(CLUSTER) status

.PHONY: fmt
fmt: ## Format the Rust code
	$(CARGO) fmt --all

.PHONY: lint
lint: ## cargo fmt --check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
