#!/usr/bin/env bash
# The nextest phases of `make test` (and of `make test-matrix`, without the model): every test
# of the workspace, each under its deadline (.config/nextest.toml), in four runs.
#
# Tests that restart the shared API server or count its requests run last, one at a time: each
# needs the control plane to itself; so do the floods that assert a new replica's first poll
# within a second (two cores shared with other tests' dispatchers make that bound the machine's,
# not the dispatcher's). The model's checks (minutes of CPU each) and the attacks on
# a dispatcher (floods, on purpose) run apart too, each set beside itself only.
#
# Usage: tests/nextest-phases.sh [--without-model]
#   --without-model   leave out the protocol model's checks (they never talk to an API server)
# Needs the control plane up and `cargo build --bins` done.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

with_model=1
case ${1:-} in
  "") ;;
  --without-model) with_model= ;;
  *) echo "usage: tests/nextest-phases.sh [--without-model]" >&2; exit 2 ;;
esac

PATH="$(tests/nextest.sh):$PATH"
# The faults group's modules but `apiserver` restart the shared API server or count its requests.
alone='(binary_id(kube-dispatch-tests::faults) & not test(/^apiserver::/))'
alone+=' | (package(kube-dispatch-bench) & kind(test))'
alone+=' | (binary_id(kube-dispatch-tests::security) & test(/^flood::/))'
model='package(kube-dispatch-model)'
attacks='(binary_id(kube-dispatch-tests::security) & test(/^hostile(_tenants)?::/))'
cargo nextest run --workspace --locked --no-tests=warn -E "not ($alone | $model | $attacks)"
[[ -z $with_model ]] || cargo nextest run --workspace --locked --no-tests=fail -E "$model"
cargo nextest run --workspace --locked --no-tests=fail -E "$attacks"
cargo nextest run --workspace --locked --no-tests=fail -E "$alone" --test-threads 1
