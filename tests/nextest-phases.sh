#!/usr/bin/env bash
# The nextest phases of `make test` (and of `make test-matrix`, without the model): every test
# of the workspace, each under its deadline (.config/nextest.toml).
#
# 1. Side by side, since each mostly waits (on an API server, or the other's CPU):
#    - the main set, on the shared control plane ($KD_CLUSTER_DIR, by default .cluster);
#    - the tests that restart the API server or count its requests, one at a time, on a control
#      plane of their own (<the shared one's folder>-apart, started here and stopped at the end
#      if it was not running): each needs an API server to itself;
#    - the protocol model's checks (minutes of CPU each, no API server), at a low priority, on
#      the CPU the others leave idle (before the background builds of `make test` get it).
#    The main set's output comes as it runs, the others' after it (their logs stay in
#    target/nextest-phases/).
# 2. The attacks on a dispatcher (floods, on purpose), beside themselves only.
# 3. The tests that bound a latency by a second, one at a time and alone on the machine: the
#    floods that time a new replica's first poll, and the join under refused lists that no
#    write may wait a second longer for. Two cores and an API server shared with the main
#    set's 500 tests would make those bounds the machine's, not the tier's (the join's test,
#    78 to 152 ms alone here, once saw a write wait 1.6 s in the main set).
#
# Every set of phase 1 runs to its end even when another fails; the script then fails with the
# first failing set's status and does not start phase 2.
#
# Usage: tests/nextest-phases.sh [--without-model]
#   --without-model   leave out the protocol model's checks (they never talk to an API server)
# Needs the shared control plane up and `cargo build --bins` done.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tests/background.sh
source tests/background.sh

with_model=1
case ${1:-} in
  "") ;;
  --without-model) with_model= ;;
  *) echo "usage: tests/nextest-phases.sh [--without-model]" >&2; exit 2 ;;
esac

PATH="$(tests/nextest.sh):$PATH"
# The faults group's modules but `apiserver` restart the API server or count its requests; so
# do the benchmark's smoke tests.
apart='(binary_id(kube-dispatch-tests::faults) & not test(/^apiserver::/))'
apart+=' | (package(kube-dispatch-bench) & kind(test))'
alone='(binary_id(kube-dispatch-tests::security) & test(/^flood::/))'
alone+=' | (binary_id(kube-dispatch-tests::ring) & test(/^handover::joining::/))'
model='package(kube-dispatch-model)'
attacks='(binary_id(kube-dispatch-tests::security) & test(/^hostile(_tenants)?::/))'

logs=${CARGO_TARGET_DIR:-target}/nextest-phases
mkdir -p "$logs"
apart_dir=${KD_CLUSTER_DIR:-$PWD/.cluster}-apart
apart_started=
declare -A jobs=()
cleanup() {
  local name
  for name in "${!jobs[@]}"; do
    stop_session "${jobs[$name]}"
  done
  if [[ -n $apart_started ]]; then
    KD_CLUSTER_DIR=$apart_dir tests/cluster/cluster.sh down >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

if ! KD_CLUSTER_DIR=$apart_dir tests/cluster/cluster.sh status >/dev/null 2>&1; then
  apart_started=1
fi
mkdir -p "$apart_dir"
# shellcheck disable=SC2016 # expanded by the job's shell
niced 0 bash -c 'KD_CLUSTER_DIR=$0 tests/cluster/cluster.sh up >/dev/null &&
  KD_CLUSTER_DIR=$0 KUBECONFIG=$0/kubeconfig cargo nextest run --workspace --locked \
    --no-tests=fail -E "$1" --test-threads 1' "$apart_dir" "$apart" \
  >"$logs/apart.log" 2>&1 </dev/null &
jobs[apart]=$!
if [[ -n $with_model ]]; then
  # Above the background builds of `make test` (19), below the tests (0).
  niced 10 cargo nextest run --workspace --locked --no-tests=fail -E "$model" \
    >"$logs/model.log" 2>&1 </dev/null &
  jobs[model]=$!
fi

rc=0
cargo nextest run --workspace --locked --no-tests=warn -E "not ($apart | $alone | $model | $attacks)" || rc=$?
for name in apart model; do
  [[ -n ${jobs[$name]:-} ]] || continue
  job_rc=0
  wait "${jobs[$name]}" || job_rc=$?
  unset "jobs[$name]"
  case $name in
    apart) printf '\n==> beside it, on a control plane of their own (%s): the tests that restart the API server or count its requests\n' "${apart_dir#"$PWD"/}" ;;
    model) printf '\n==> beside it, at a low priority: the protocol model\n' ;;
  esac
  cat "$logs/$name.log"
  if ((job_rc != 0)); then
    echo "nextest-phases: the $name set failed with exit $job_rc (its log: $logs/$name.log)" >&2
    ((rc != 0)) || rc=$job_rc
  fi
done
((rc == 0)) || exit "$rc"

cargo nextest run --workspace --locked --no-tests=fail -E "$attacks"
cargo nextest run --workspace --locked --no-tests=fail -E "$alone" --test-threads 1
