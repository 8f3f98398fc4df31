#!/usr/bin/env bash
# Checks that the Rust workspace's k8s-openapi feature names the Kubernetes minor that go.mod
# pins for the API server, so the types the code compiles against match the server it tests on,
# and that the controller-runtime incumbent (bench/controller-runtime) uses the same client-go.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/versions.sh
source "$here/versions.sh"

want="v$KD_KUBERNETES_MINOR"
line=$(grep -E '^k8s-openapi *=' "$KD_ROOT/Cargo.toml" || true)
if [[ $line != *"\"$want\""* ]]; then
  echo "check-versions: tests/cluster/go.mod pins Kubernetes $KD_KUBERNETES_VERSION, so Cargo.toml's k8s-openapi must enable feature \"$want\"; it says: $line" >&2
  exit 1
fi
client_go=$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$KD_ROOT/bench/controller-runtime/go.mod")
if [[ $client_go != "${KD_KUBERNETES_VERSION/v1./v0.}" ]]; then
  echo "check-versions: tests/cluster/go.mod pins Kubernetes $KD_KUBERNETES_VERSION, so bench/controller-runtime/go.mod must use k8s.io/client-go ${KD_KUBERNETES_VERSION/v1./v0.} (and the controller-runtime release built for it); it says: ${client_go:-nothing}" >&2
  exit 1
fi
echo "check-versions: Kubernetes $KD_KUBERNETES_VERSION, etcd $KD_ETCD_VERSION, k8s-openapi feature $want, controller-runtime's client-go $client_go"
