#!/usr/bin/env bash
# Checks that the Rust workspace's k8s-openapi feature names the Kubernetes minor that go.mod
# pins for the API server, so the types the code compiles against match the server it tests on.
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
echo "check-versions: Kubernetes $KD_KUBERNETES_VERSION, etcd $KD_ETCD_VERSION, k8s-openapi feature $want"
