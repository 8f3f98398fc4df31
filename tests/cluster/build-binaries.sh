#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kubectl and etcd (the control plane), and
# kubelet, kube-scheduler and kube-proxy (the local node, tests/node/node.sh), from the upstream
# Go modules at the versions pinned in tests/cluster/go.mod (or, with KUBERNETES_VERSION=<minor>,
# in tests/cluster/kubernetes/<minor>/go.mod; see versions.sh), with the machine's Go toolchain.
#
# The binaries are cached in .cache/kubernetes/<kubernetes>-etcd-<etcd>-<recipe digest>/bin
# (git-ignored; the digest covers go.mod, go.sum and this script); when all of them are there,
# nothing is built. Each minor keeps one set (about 550 MB). Prints the bin folder.
#
# Usage: tests/cluster/build-binaries.sh [--print-dir]
#   --print-dir   print the bin folder the pinned versions use, and build nothing
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/versions.sh
source "$here/versions.sh"

if [[ ${1:-} == --print-dir ]]; then
  echo "$KD_BIN_DIR"
  exit 0
fi

binaries=(kube-apiserver kube-controller-manager kubectl etcd kubelet kube-scheduler kube-proxy)
missing=()
for b in "${binaries[@]}"; do
  [[ -x $KD_BIN_DIR/$b ]] || missing+=("$b")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "$KD_BIN_DIR"
  exit 0
fi

command -v go >/dev/null || {
  echo "build-binaries: go is not installed; it is needed once to build ${missing[*]}" >&2
  exit 1
}

echo "build-binaries: building ${missing[*]} (Kubernetes $KD_KUBERNETES_VERSION, etcd $KD_ETCD_VERSION) with $(go version | cut -d' ' -f3); the first build takes several minutes" >&2
start=$(date +%s)
mkdir -p "$(dirname "$KD_BIN_DIR")"
staging=$(mktemp -d "${KD_BIN_DIR%/bin}.partial.XXXXXX")
trap 'rm -rf "$staging"' EXIT
# Stamp the Kubernetes version as the upstream release build does (hack/lib/version.sh), so
# `kubectl version` and the API server's /version report it.
minor=${KD_KUBERNETES_MINOR#*_}
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $pkg.gitVersion=$KD_KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
done
(
  cd "$KD_KUBERNETES_MODULE_DIR"
  # -trimpath and stripped symbols keep the cache small; the build is reproducible from go.sum.
  go build -trimpath -ldflags="$ldflags" -o "$staging/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-proxy
  go build -trimpath -ldflags='-s -w' -o "$staging/etcd" go.etcd.io/etcd/server/v3
)
mkdir -p "$KD_BIN_DIR"
for b in "${binaries[@]}"; do
  mv -f "$staging/$b" "$KD_BIN_DIR/$b"
done
# Drop the binaries other recipes built for this minor: they are never used again, and each set
# is ~550 MB. The other minors' sets stay, for the matrix.
minor_prefix=$(echo "$KD_KUBERNETES_VERSION" | sed -E 's/^(v[0-9]+\.[0-9]+)\..*/\1./')
for old in "$(dirname "${KD_BIN_DIR%/bin}")/$minor_prefix"*; do
  [[ ! -e $old || $old == "${KD_BIN_DIR%/bin}" || $old == *.partial.* ]] || rm -rf "$old"
done
echo "build-binaries: built in $(($(date +%s) - start)) s into $KD_BIN_DIR ($(du -sh "$KD_BIN_DIR" | cut -f1))" >&2
echo "$KD_BIN_DIR"
