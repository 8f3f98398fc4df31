#!/usr/bin/env bash
# Checks that the crates' dependencies point one way (README, "Layout"):
#   proto -> core -> telemetry -> server -> dispatcher, loadbalancer
#   telemetry -> controller-sdk (the SDK links no server code)
# - kube-dispatch-core is pure: no async runtime, Kubernetes client or gRPC server of its own;
# - the load balancer and the controller SDK never link the dispatcher;
# - the dispatcher never links the SDK, and the shared crates neither of them;
# - within a crate, no module imports another that imports it back (tests/check-modules.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Crates `$1` depends on (normal dependencies), directly with `--depth 1`, else transitively.
deps() {
  cargo tree --locked -e normal --prefix none --format '{p}' -p "$@" | tail -n +2 | awk '{print $1}' | sort -u
}

failed=0
check() { # crate, forbidden dependency, how (direct|any)
  local crate=$1 forbidden=$2 how=$3 found
  if [[ $how == direct ]]; then found=$(deps "$crate" --depth 1); else found=$(deps "$crate"); fi
  if grep -qx -- "$forbidden" <<<"$found"; then
    echo "check-layout: $crate must not depend on $forbidden ($how)" >&2
    failed=1
  fi
}

for forbidden in tokio tokio-util kube kube-runtime kube-client k8s-openapi tonic; do
  check kube-dispatch-core "$forbidden" direct
done
check kube-dispatch-loadbalancer kube-dispatch-dispatcher any
check kube-dispatch-controller kube-dispatch-dispatcher any
check kube-dispatch-dispatcher kube-dispatch-controller any
for shared in kube-dispatch-telemetry kube-dispatch-server; do
  check $shared kube-dispatch-dispatcher any
  check $shared kube-dispatch-controller any
done
check kube-dispatch-telemetry kube-dispatch-server any
check kube-dispatch-telemetry kube-dispatch-core any
check kube-dispatch-controller kube-dispatch-server any
check kube-dispatch-controller kube-dispatch-testing any
check kube-dispatch-dispatcher kube-dispatch-testing any
check kube-dispatch-kdctl kube-dispatch-dispatcher any
check kube-dispatch-kdctl kube-dispatch-controller any

python3 tests/check-modules.py proto/src core/src telemetry/src server/src testing/src dispatcher/src controller-sdk/src \
  loadbalancer/src kdctl/src model/src tests/src bench/src || failed=1

if [[ $failed == 1 ]]; then exit 1; fi
echo "check-layout: dependencies point one way, between crates and between modules"
