#!/usr/bin/env bash
# Checks that the Rust workspace's k8s-openapi feature names the Kubernetes minor that
# tests/cluster/go.mod pins for the API server (the default, newest minor), so the types the code
# compiles against match the server it tests on by default; that the controller-runtime incumbent
# (bench/controller-runtime) uses the same client-go, and the dispatcher's table of types
# (dispatcher/k8s-protobuf) the same k8s.io/api; and that each older minor of the matrix
# (tests/cluster/kubernetes/<minor>/go.mod) pins a release of that minor, older than the default.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The workspace pins against the default release, whichever KUBERNETES_VERSION a run uses.
unset KUBERNETES_VERSION
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
types=$(awk '$1 == "k8s.io/api" { print $2; exit }' "$KD_ROOT/dispatcher/k8s-protobuf/go.mod")
if [[ $types != "${KD_KUBERNETES_VERSION/v1./v0.}" ]]; then
  echo "check-versions: tests/cluster/go.mod pins Kubernetes $KD_KUBERNETES_VERSION, so the dispatcher's table of types must be made from k8s.io/api ${KD_KUBERNETES_VERSION/v1./v0.} (dispatcher/k8s-protobuf/go.mod, then make protobuf-table); it says: ${types:-nothing}" >&2
  exit 1
fi
default_minor=$KD_KUBERNETES_DEFAULT_MINOR
for dir in "$KD_ROOT"/tests/cluster/kubernetes/*/; do
  minor=$(basename "$dir")
  pinned=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$dir/go.mod")
  if [[ $pinned != "v$minor."* ]]; then
    echo "check-versions: tests/cluster/kubernetes/$minor/go.mod must pin a Kubernetes $minor release; it pins ${pinned:-nothing}" >&2
    exit 1
  fi
  if [[ $(printf '%s\n%s\n' "$minor" "$default_minor" | sort -t. -k1,1n -k2,2n | tail -1) != "$default_minor" || $minor == "$default_minor" ]]; then
    echo "check-versions: the matrix minor $minor must be older than the default $default_minor (tests/cluster/go.mod): the default is the newest" >&2
    exit 1
  fi
done
echo "check-versions: Kubernetes $KD_KUBERNETES_VERSION, etcd $KD_ETCD_VERSION, k8s-openapi feature $want, controller-runtime's client-go $client_go, the table of types' k8s.io/api $types; matrix: $KD_KUBERNETES_MINORS"
