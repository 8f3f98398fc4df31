#!/usr/bin/env bash
# `make test-matrix`: the suites that talk to the API server, on each older supported Kubernetes
# minor (`make test` runs them on the newest, tests/cluster/go.mod). For each minor: its binaries
# built from its pinned modules (tests/cluster/kubernetes/<minor>/go.mod), a control plane of its
# own in .cluster-<minor> (the default one in .cluster is left alone), every nextest phase but the
# protocol model's (it never talks to an API server), and the Go SDK's tests; then that control
# plane is stopped. Prints a table at the end; exits non-zero if any minor failed.
#
# Usage: tests/matrix.sh            every older minor (see KD_KUBERNETES_MINORS in versions.sh)
#        MINORS="1.35" tests/matrix.sh
# A failed minor's logs stay in .cluster-<minor>/logs and .cluster-<minor>/matrix.log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tests/cluster/versions.sh
source tests/cluster/versions.sh
minors=${MINORS:-$(echo "$KD_KUBERNETES_MINORS" | tr ' ' '\n' | grep -vx "$KD_KUBERNETES_DEFAULT_MINOR" | tr '\n' ' ')}

step() { printf '\n==> %s\n' "$*"; }

step "cargo build --bins (once for every minor)"
cargo build --workspace --bins --locked --quiet

results=()
failed=0
[[ -n ${minors// /} ]] || { echo "matrix: no minor to run (MINORS is empty)" >&2; exit 2; }
for minor in $minors; do
  export KUBERNETES_VERSION=$minor
  export KD_CLUSTER_DIR=$PWD/.cluster-$minor
  export KUBECONFIG=$KD_CLUSTER_DIR/kubeconfig
  mkdir -p "$KD_CLUSTER_DIR"
  log=$KD_CLUSTER_DIR/matrix.log
  step "Kubernetes $minor: binaries, control plane in ${KD_CLUSTER_DIR#"$PWD"/}, the suites (log: ${log#"$PWD"/})"
  start=$SECONDS
  # set -e holds in the subshell only outside a `||` list: take its status from PIPESTATUS.
  set +e
  (
    set -euo pipefail
    trap 'tests/cluster/cluster.sh down >/dev/null 2>&1 || true' EXIT
    tests/cluster/build-binaries.sh >/dev/null
    tests/cluster/cluster.sh up >/dev/null
    version=$("$(tests/cluster/build-binaries.sh --print-dir)/kubectl" --kubeconfig "$KUBECONFIG" version -o json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
    echo "the API server says $version"
    tests/nextest-phases.sh --without-model
    tests/go-sdk.sh --tests-only
  ) 2>&1 | tee "$log"
  code=${PIPESTATUS[0]}
  set -e
  status=passed
  if ((code != 0)); then status="failed (exit $code)"; failed=1; fi
  # nextest's summary lines: "Summary [ 123.4s] 322 tests run: 322 passed, 2 skipped", or
  # "5/322 tests run: ..." when a run stopped at its first failure.
  counts=$({ grep -E '^ *Summary \[' "$log" || true; } |
    sed -E 's/.* ([0-9]+)(\/[0-9]+)? tests? run: ([0-9]+) passed.*/\1 \3/' |
    awk '{ run += $1; ok += $2 } END { printf "%d/%d", ok, run }')
  go=$({ grep -cE '^ok ' "$log" || true; })
  pinned=$( (source tests/cluster/versions.sh && echo "$KD_KUBERNETES_VERSION etcd $KD_ETCD_VERSION") 2>/dev/null || echo "?")
  results+=("| $minor | $pinned | $counts | $go | $((SECONDS - start)) s | $status |")
done

printf '\n| minor | pinned | Rust tests passed/run | Go packages ok | time | result |\n| --- | --- | --- | --- | --- | --- |\n'
printf '%s\n' "${results[@]}"
exit $failed
