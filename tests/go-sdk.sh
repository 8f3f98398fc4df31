#!/usr/bin/env bash
# The Go controller SDK (controller-sdk/go), as `make test` checks it: formatting, go vet,
# staticcheck, stubs current with the .proto files (and the dispatcher's table of Kubernetes
# types current with its generator, dispatcher/k8s-protobuf), and its tests, the ones against the real
# API server with real dispatcher and load-balancer binaries (target/debug) and the Rust SDK's
# example controller beside the Go replicas included.
# Needs the control plane up (tests/cluster/cluster.sh) and `cargo build --bins` done.
#
# Usage: tests/go-sdk.sh [--tests-only | --prebuild]
#   --tests-only   only the tests (as `make test-matrix` runs them on each Kubernetes minor)
#   --prebuild     only compile what the checks and tests need, into Go's build cache; needs
#                  neither the control plane nor the Rust binaries
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../controller-sdk/go"
STATICCHECK_VERSION=v0.8.2
root=$(cd ../.. && pwd)

run_tests() {
  # Built already by `cargo test --workspace --no-run` (make test); nothing to do then. Asked of
  # the whole workspace, as that build was: with `-p` alone cargo would unify fewer features and
  # build every dependency again (a cold run did, during this step).
  (cd "$root" && cargo build --workspace --example configmap_hasher --locked --quiet)
  KUBECONFIG="${KUBECONFIG:-${KD_CLUSTER_DIR:-$root/.cluster}/kubeconfig}" \
    KD_BIN_DIR="${CARGO_TARGET_DIR:-$root/target}/debug" \
    KUBE_DISPATCH_ASSETS="${CARGO_TARGET_DIR:-$root/target}/debug" \
    KUBEBUILDER_ASSETS="$("$root/tests/cluster/build-binaries.sh" --print-dir)" \
    KD_REQUIRE_CLUSTER=1 \
    go test -race -count=1 -timeout 10m ./...
}
# What the checks and the tests compile, compiled into Go's build cache without running
# anything: `make test` runs it in the background while other steps run.
prebuild() {
  go vet ./...
  # The analysis, not only the linter's build: its results are cached, so the check below
  # takes a second where a cold one took half a minute.
  go run "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" ./...
  (cd "$root/bench/controller-runtime-dispatch" && go vet ./...)
  (cd "$root/dispatcher/k8s-protobuf" && go vet ./... && go build -o /dev/null .)
  # One binary per package with tests, each under a name of its own: packages of one name
  # (the examples' incumbent and ported) would write the same file.
  local out package
  out=$(mktemp -d)
  for package in $(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...); do
    go test -race -c -o "$out/${package//\//_}.test" "$package" >/dev/null
  done
  # And without the race detector, as make test runs the release fetch's test
  # (tests/release-fetch.sh, beside the e2e).
  go test -c -o "$out/dispatchtest.test" ./dispatchtest >/dev/null
  rm -rf "$out"
}
case ${1:-} in
  "") ;;
  --tests-only) run_tests; exit 0 ;;
  --prebuild) prebuild; exit 0 ;;
  *) echo "usage: tests/go-sdk.sh [--tests-only | --prebuild]" >&2; exit 2 ;;
esac

unformatted=$(gofmt -l .)
[[ -z $unformatted ]] || { echo "gofmt would change: $unformatted" >&2; exit 1; }
go vet ./...
go run "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" ./...
if ! diff <(./sources.sh) internal/wire/SOURCES >/dev/null; then
  echo "the Go stubs are older than proto/: run controller-sdk/go/generate.sh" >&2
  exit 1
fi
# One version for the tier and both SDKs: the workspace's (Cargo.toml).
version=$("$root/deploy/version.sh")
grep -qx "const Version = \"$version\"" dispatch/version.go || {
  echo "dispatch.Version (dispatch/version.go) is not the workspace's version $version" >&2
  exit 1
}
# Controllers written for controller-runtime and ported: at most ten lines differ (removed and
# added, counted apart) between each and its port, its test set-up included.
ported_within_ten() { # incumbent directory, ported directory, files
  local incumbent=$1 ported=$2 changed=0 file
  shift 2
  for file in "$@"; do
    changed=$((changed + $(diff "$incumbent/$file" "$ported/$file" | grep -c '^[<>]' || true)))
  done
  if (( changed > 10 )); then
    echo "${ported#"$root"/} differs from the controller it ports (${incumbent#"$root"/}) in $changed lines (at most 10)" >&2
    exit 1
  fi
}
ported_within_ten "$root/bench/controller-runtime" "$root/bench/controller-runtime-dispatch" main.go
for example in bundles mirrors; do
  ported_within_ten "$PWD/examples/$example/incumbent" "$PWD/examples/$example/ported" controller.go suite_test.go
done
ported=$root/bench/controller-runtime-dispatch
unformatted=$(gofmt -l "$ported")
[[ -z $unformatted ]] || { echo "gofmt would change: $unformatted" >&2; exit 1; }
(cd "$ported" && go vet ./...)
# The generator of the dispatcher's table of Kubernetes types: linted, and the table current
# with the Go types it is made from.
generator=$root/dispatcher/k8s-protobuf
unformatted=$(gofmt -l "$generator")
[[ -z $unformatted ]] || { echo "gofmt would change: $unformatted" >&2; exit 1; }
(cd "$generator" && go vet ./... && go run "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" ./...)
if ! (cd "$generator" && go run .) 2>/dev/null | cmp -s - "$root/dispatcher/src/watch/protobuf/table.txt"; then
  echo "dispatcher/src/watch/protobuf/table.txt is not what dispatcher/k8s-protobuf writes: run make protobuf-table" >&2
  exit 1
fi
run_tests
