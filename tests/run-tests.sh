#!/usr/bin/env bash
# `make test`: what CI runs, in order. Builds what is missing (the pinned Kubernetes binaries;
# protoc comes with the proto crate's build), checks formatting, lints and docs, then runs every
# test, including the ones against the real control plane. A control plane this script started is
# stopped at the end; one that was already running is left running.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each step's wall time, printed as it ends and summed up at the end, so a slow run says where
# its minutes went (a fresh machine spends most of them building), with how busy the machine's
# CPUs were meanwhile (foreground and background together, from /proc/stat): a step that waited
# with the CPUs idle is where moving work would help, one that kept them busy is not.
timings=()
step_name= step_start= step_cpu=
cpu_ticks() { # busy and total ticks of all CPUs since boot
  local _ user nice system idle iowait irq softirq steal
  read -r _ user nice system idle iowait irq softirq steal _ </proc/stat
  echo "$((user + nice + system + irq + softirq + steal)) $((user + nice + system + idle + iowait + irq + softirq + steal))"
}
end_step() {
  [[ -n $step_name ]] || return 0
  local busy total busy0 total0 share=0
  read -r busy total < <(cpu_ticks)
  read -r busy0 total0 <<<"$step_cpu"
  ((total > total0)) && share=$((100 * (busy - busy0) / (total - total0)))
  timings+=("$(printf '%6d s  %3d %% busy  %s' $((SECONDS - step_start)) "$share" "$step_name")")
  step_name=
}
step() {
  end_step
  step_name=$* step_start=$SECONDS step_cpu=$(cpu_ticks)
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

# Compile work that later steps need runs in the background, at the lowest priority, so that
# it takes the CPU the foreground leaves idle (tests waiting on the API server, a node
# starting) rather than a step of its own: the end-to-end image's static binaries (another
# profile and target than the tests', so another cargo lock), the Go SDK's checks and
# race-enabled tests, and the controller-runtime incumbent's vet and build. The step that needs
# one waits for it (`await`); its failure fails the run, with its log.
logs=${CARGO_TARGET_DIR:-target}/make-test
# shellcheck source=tests/background.sh
source tests/background.sh
mkdir -p "$logs"
declare -A background=()
background() { # name, command... (at the lowest priority; BACKGROUND_NICE=0 for a normal one)
  local name=$1
  shift
  niced "${BACKGROUND_NICE:-19}" "$@" >"$logs/$name.log" 2>&1 </dev/null &
  background[$name]=$!
}
await() { # name
  local name=$1 rc=0
  wait "${background[$name]}" || rc=$?
  unset "background[$name]"
  if ((rc != 0)); then
    echo "run-tests: $name (in the background) failed with exit $rc; its log, $logs/$name.log:" >&2
    cat "$logs/$name.log" >&2
    exit "$rc"
  fi
}
stop_background() { # on the way out of a failed run: says what each job left in the background did
  local name pid rc
  for name in "${!background[@]}"; do
    pid=${background[$name]}
    if kill -0 "$pid" 2>/dev/null; then
      # Its process group, and the whole session: envtest starts its API server and etcd in
      # process groups of their own.
      stop_session "$pid"
      echo "run-tests: stopped $name (in the background); its log: $logs/$name.log" >&2
    else
      rc=0
      wait "$pid" || rc=$?
      ((rc == 0)) || echo "run-tests: $name (in the background) had failed with exit $rc; its log: $logs/$name.log" >&2
    fi
  done
}
# Clean up first, then say what each step took: printing can fail (a closed pipe after Ctrl-C),
# and the exit status stays the run's.
trap 'rc=$?; stop_background; stop_cluster; summary "$rc" 2>/dev/null || true; exit "$rc"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Incremental compilation keeps state that a run building each crate once or twice never reads
# back: on a cold clone it is the largest part of target/debug (several GiB), on the disk CI and
# fresh machines share. CARGO_INCREMENTAL=1 keeps it for a developer's repeated runs.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

# A cold clone's run writes about 20 GiB (Go's build cache 11, target/ 6, the module caches and
# the Kubernetes binaries the rest): say so before the first build rather than as a compiler's
# I/O error minutes later.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if ((free_kib < 20 * 1024 * 1024)); then
  echo "run-tests: warning: $((free_kib / 1024 / 1024)) GiB free on $(df -P . | awk 'NR == 2 { print $6 }'); a cold run needs about 20 GiB (README, \"A test command\")" >&2
fi

step "pinned versions"
tests/cluster/check-versions.sh

# The Kubernetes binaries (minutes of Go on a fresh machine, much of it fetching modules) and
# cargo-nextest build beside the Rust checks and builds at a normal priority: the tests need
# them only after those. The other Go builds start once the Kubernetes binaries are done, not to
# compete for the module proxy; they and the end-to-end image's binaries (the `e2e` profile:
# unoptimised) take the CPU the tests leave idle.
BACKGROUND_NICE=0 background kubernetes tests/cluster/build-binaries.sh
BACKGROUND_NICE=0 background nextest tests/nextest.sh
# Prometheus and promtool (the distribution's package, unpacked once): the alert rules' test
# runs them against a dispatcher, and their checks below.
background prometheus tests/cluster/prometheus.sh
background e2e-binaries bash -c 'deploy/image.sh --profile e2e --binaries-only && deploy/image.sh --go-example --binaries-only'

step "crate layout, sizes, the walkthrough and the ports"
tests/check-layout.sh
python3 tests/check-sizes.py
python3 tests/check-walkthrough.py
tests/check-ports.sh

step "wire API compatible with the last release (tests/proto-compat.sh)"
tests/proto-compat.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "gofmt (the controller-runtime incumbent; its go vet runs in the background)"
unformatted=$(gofmt -l bench/controller-runtime)
[[ -z $unformatted ]] || { echo "gofmt would change: $unformatted" >&2; exit 1; }

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "cargo build --bins"
# The benchmark smoke test starts the dispatcher and load-balancer binaries.
cargo build --workspace --bins --locked --quiet

step "cargo test --doc"
cargo test --workspace --doc --locked --quiet

step "the tests built (what cargo nextest runs)"
cargo test --workspace --no-run --locked --quiet

step "Kubernetes binaries (built beside the steps above)"
await kubernetes
background go-sdk tests/go-sdk.sh --prebuild
# The benchmark tests' controller-runtime incumbent and its port to the Go SDK, built here on
# idle CPU rather than in the serial test phase that first asks for them (a build the tests ask
# for meanwhile waits for this one: bench/controller-runtime/build.sh takes a lock).
background incumbents bash -c 'cd bench/controller-runtime && go vet ./... && ./build.sh >/dev/null && ./build.sh dispatch >/dev/null'
background helm tests/tools.sh helm

if ! $cluster status >/dev/null 2>&1; then
  step "control plane"
  $cluster up >/dev/null
  started=1
fi

step "cargo nextest: every test, each under its deadline, the sets that need an API server to themselves on a second one (tests/nextest-phases.sh)"
await nextest
await prometheus
tests/nextest-phases.sh

step "Go controller SDK started beside the steps below, once the incumbent's go vet and build are done"
await incumbents
await go-sdk
# Its checks and its tests (on the shared control plane; the real node's e2e below has one of
# its own) spend most of their time waiting on the API server, as the e2e does: side by side,
# at a normal priority, rather than one after the other.
BACKGROUND_NICE=0 background go-sdk-tests tests/go-sdk.sh

step "Helm chart (tests/helm.sh)"
# One source with deploy/base, lint, the same objects as kustomize, a server-side dry run.
await helm
tests/helm.sh

step "Grafana dashboard"
# The schema, the PromQL, and the metric names the tests saw each process export.
KD_EXPORTED_METRICS_DIR="${CARGO_TARGET_DIR:-target}/tmp" tests/grafana/check-dashboard.sh

step "Alert rules (tests/check-alerts.sh)"
# promtool's check and unit tests (a firing and a silent case for each alert), the runbook's
# sections, and the metric names the rules read.
KD_EXPORTED_METRICS_DIR="${CARGO_TARGET_DIR:-target}/tmp" tests/check-alerts.sh

step "deploy/ on a real node (make e2e, short form)"
# The image built without a registry, the node started (and taken down again), the example
# overlay applied with kustomize, then a rolling update of the dispatchers and the controller
# scaled 2 -> 1 with a writer all along: lost 0 and concurrent 0, or this fails. `make e2e`
# adds a pod deletion, evictions against the PodDisruptionBudget and scaling 2 -> 4 -> 1.
await e2e-binaries
# The archive of the e2e image's binaries, laid out as a release publishes it, served on
# loopback to the Go SDK's fetch (dispatchtest.DownloadBinaryAssets), whose binaries must run:
# beside the e2e, from the same binaries.
BACKGROUND_NICE=0 background release-assets tests/release-fetch.sh
E2E_SHORT=1 E2E_PROFILE=e2e tests/e2e.sh

step "release assets (deploy/release-assets.sh), fetched as dispatchtest fetches them (beside the e2e)"
await release-assets
grep -E '^(--- |ok|FAIL)' "$logs/release-assets.log"

step "Go controller SDK (tests/go-sdk.sh): what was left of it after the steps beside it"
await go-sdk-tests
grep -vE '^\?|no test files' "$logs/go-sdk-tests.log" || true
