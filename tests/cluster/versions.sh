# Sourced by the cluster scripts: reads the pinned versions from go.mod (the one place they are
# set) and derives the paths that depend on them.
#   KD_ROOT                 the repository root
#   KD_KUBERNETES_VERSION   e.g. v1.36.3
#   KD_KUBERNETES_MINOR     e.g. 1_36 (the k8s-openapi feature is v1_36)
#   KD_ETCD_VERSION         e.g. v3.6.8
#   KD_BIN_DIR              where the built binaries are cached: keyed by the versions and by a
#                           digest of the build recipe, so a changed recipe builds afresh

KD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
_kd_gomod="$KD_ROOT/tests/cluster/go.mod"
KD_KUBERNETES_VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$_kd_gomod")
KD_ETCD_VERSION=$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ { print $2; exit }' "$_kd_gomod")
if [[ -z $KD_KUBERNETES_VERSION || -z $KD_ETCD_VERSION ]]; then
  echo "versions.sh: cannot read the k8s.io/kubernetes and etcd server versions from $_kd_gomod" >&2
  exit 1
fi
KD_KUBERNETES_MINOR=$(echo "$KD_KUBERNETES_VERSION" | sed -E 's/^v([0-9]+)\.([0-9]+)\..*/\1_\2/')
_kd_recipe=$(cd "$KD_ROOT/tests/cluster" && cat go.mod go.sum build-binaries.sh | sha256sum | cut -c1-10)
KD_BIN_DIR="${KD_CACHE_DIR:-$KD_ROOT/.cache}/kubernetes/$KD_KUBERNETES_VERSION-etcd-$KD_ETCD_VERSION-$_kd_recipe/bin"
export KD_ROOT KD_KUBERNETES_VERSION KD_KUBERNETES_MINOR KD_ETCD_VERSION KD_BIN_DIR
unset _kd_gomod _kd_recipe
