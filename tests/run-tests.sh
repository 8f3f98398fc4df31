#!/usr/bin/env bash
# `make test`: what CI runs, in order. Builds what is missing (the pinned Kubernetes binaries;
# protoc comes with the proto crate's build), checks formatting, lints and docs, then runs every
# test, including the ones against the real control plane. A control plane this script started is
# stopped at the end; one that was already running is left running.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each step's wall time, printed as it ends and summed up at the end, so a slow run says where
# its minutes went (a fresh machine spends most of them building).
timings=()
step_name= step_start=
end_step() {
  [[ -n $step_name ]] || return 0
  timings+=("$(printf '%6d s  %s' $((SECONDS - step_start)) "$step_name")")
  step_name=
}
step() {
  end_step
  step_name=$* step_start=$SECONDS
  printf '\n==> %s\n' "$*"
}
summary() {
  end_step
  printf '\n==> time per step (exit %d after %d s)\n' "$1" "$SECONDS"
  printf '%s\n' "${timings[@]}"
}
cluster=tests/cluster/cluster.sh
started=
stop_cluster() { [[ -z $started ]] || $cluster down >/dev/null 2>&1 || true; }
# Clean up first, then say what each step took: printing can fail (a closed pipe after Ctrl-C),
# and the exit status stays the run's.
trap 'rc=$?; stop_cluster; summary "$rc" 2>/dev/null || true; exit "$rc"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

step "pinned versions"
tests/cluster/check-versions.sh

step "crate layout, sizes and the walkthrough"
tests/check-layout.sh
python3 tests/check-sizes.py
python3 tests/check-walkthrough.py

step "wire API compatible with the last release (tests/proto-compat.sh)"
tests/proto-compat.sh

step "Kubernetes binaries"
tests/cluster/build-binaries.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "gofmt and go vet (the controller-runtime incumbent)"
unformatted=$(gofmt -l bench/controller-runtime)
[[ -z $unformatted ]] || { echo "gofmt would change: $unformatted" >&2; exit 1; }
(cd bench/controller-runtime && go vet ./...)

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

if ! $cluster status >/dev/null 2>&1; then
  step "control plane"
  $cluster up >/dev/null
  started=1
fi

step "cargo build --bins"
# The benchmark smoke test starts the dispatcher and load-balancer binaries.
cargo build --workspace --bins --locked --quiet

step "cargo test --doc"
cargo test --workspace --doc --locked --quiet

step "cargo nextest: every test, each under its deadline (tests/nextest-phases.sh)"
tests/nextest-phases.sh

step "Go controller SDK (tests/go-sdk.sh)"
tests/go-sdk.sh

step "Helm chart (tests/helm.sh)"
# One source with deploy/base, lint, the same objects as kustomize, a server-side dry run.
tests/helm.sh

step "Grafana dashboard"
# The schema, the PromQL, and the metric names the tests saw each process export.
KD_EXPORTED_METRICS_DIR="${CARGO_TARGET_DIR:-target}/tmp" tests/grafana/check-dashboard.sh

step "deploy/ on a real node (make e2e, short form)"
# The image built without a registry, the node started (and taken down again), the example
# overlay applied with kustomize, then a rolling update of the dispatchers and the controller
# scaled 2 -> 1 with a writer all along: lost 0 and concurrent 0, or this fails. `make e2e`
# adds a pod deletion, evictions against the PodDisruptionBudget and scaling 2 -> 4 -> 1.
E2E_SHORT=1 tests/e2e.sh
