#!/usr/bin/env bash
# `make demo`: runs kube-dispatch on an embedded default, on one machine. Builds what it needs,
# starts (or reuses) the local control plane on loopback, then tests/demo.py runs three
# dispatchers, the load balancer, two replicas of the example controller and Prometheus (the
# distribution's package, unpacked by tests/cluster/prometheus.sh) as local processes,
# creates ConfigMaps, kills a replica and a dispatcher, adds a dispatcher, and prints a summary
# ending with lost = 0 and concurrent = 0 (exit status 0 only then).
#
# Environment:
#   DEMO_OBJECTS=N   ConfigMaps to create (default 2000)
#   KEEP=1           leave everything running at the end, for exploration (the demo prints the
#                    pids to kill; `make cluster-down` stops the control plane)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf 'demo: %s\n' "$*"; }
cluster=tests/cluster/cluster.sh

started_cluster=
if ! $cluster status >/dev/null 2>&1; then started_cluster=1; fi
kubeconfig=$($cluster up)
finish() {
  if [[ -n $started_cluster && -z ${KEEP:-} ]]; then
    $cluster down >/dev/null 2>&1 || true
    say "stopped the control plane it started"
  fi
}
trap finish EXIT

say "building the dispatcher, the load balancer, kdctl and the example controller"
# Built as `make test` builds them, so that either command reuses what the other built: the
# binaries with the workspace's features (`cargo build --workspace --bins`), the example with
# its tests' (`cargo test --workspace`), and no incremental state (tests/run-tests.sh). With
# `-p` alone cargo would unify fewer features and build every dependency once more.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
cargo build --quiet --locked --workspace --bin kube-dispatch-dispatcher \
  --bin kube-dispatch-loadbalancer --bin kdctl
cargo build --quiet --locked --workspace --example configmap_hasher

prometheus=$(tests/cluster/prometheus.sh)

python3 tests/demo.py "$kubeconfig" "$(tests/cluster/build-binaries.sh --print-dir)/kubectl" \
  target/debug "${KD_CLUSTER_DIR:-.cluster}/logs/demo" "$prometheus"
