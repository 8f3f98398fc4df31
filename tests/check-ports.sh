#!/usr/bin/env bash
# Checks that each Rust controller written as its ecosystem writes one and its port to the SDK
# (controller-sdk/examples/ported/<name>_kube_rs.rs and <name>.rs, each with its tests) differ in
# at most ten lines, removed and added counted apart, its test's set-up included.
# (tests/go-sdk.sh checks the Go SDK's pairs the same way.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../controller-sdk/examples/ported"

failed=0
for incumbent in *_kube_rs.rs; do
  ported=${incumbent%_kube_rs.rs}.rs
  changed=$(diff "$incumbent" "$ported" | grep -c '^[<>]' || true)
  if (( changed > 10 )); then
    echo "check-ports: $ported differs from the controller it ports ($incumbent) in $changed lines (at most 10)" >&2
    failed=1
  else
    echo "check-ports: $ported ports $incumbent in $changed lines"
  fi
done
exit "$failed"
