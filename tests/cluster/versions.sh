# Sourced by the cluster scripts: reads the pinned versions from a go.mod (the one place they are
# set) and derives the paths that depend on them.
#
# tests/cluster/go.mod pins the default Kubernetes release, the newest supported minor: what
# `make test` runs on and what the Rust workspace's k8s-openapi feature names. Each older
# supported minor has a module of its own in tests/cluster/kubernetes/<minor>/go.mod, chosen with
# KUBERNETES_VERSION=<minor> (e.g. KUBERNETES_VERSION=1.35 make cluster-up; `make test-matrix`).
#
# Sets and exports:
#   KD_ROOT                    the repository root
#   KD_KUBERNETES_MODULE_DIR   the folder of the go.mod in use
#   KD_KUBERNETES_VERSION      e.g. v1.37.2
#   KD_KUBERNETES_MINOR        e.g. 1_37 (the k8s-openapi feature is v1_37)
#   KD_KUBERNETES_DEFAULT      the default release (tests/cluster/go.mod), e.g. v1.37.2
#   KD_KUBERNETES_DEFAULT_MINOR  its minor, e.g. 1.37
#   KD_KUBERNETES_MINORS       the supported minors, newest first, e.g. "1.37 1.36 1.35"
#   KD_ETCD_VERSION            e.g. v3.7.0
#   KD_BIN_DIR                 where the built binaries are cached: keyed by the versions and by
#                              a digest of the build recipe, so a changed recipe builds afresh

KD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
_kd_pinned() { awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$1/go.mod"; }
_kd_minor_of() { echo "$1" | sed -E 's/^v?([0-9]+)\.([0-9]+)(\..*)?$/\1.\2/'; }

KD_KUBERNETES_DEFAULT=$(_kd_pinned "$KD_ROOT/tests/cluster" k8s.io/kubernetes)
KD_KUBERNETES_DEFAULT_MINOR=$(_kd_minor_of "$KD_KUBERNETES_DEFAULT")
KD_KUBERNETES_MINORS=$KD_KUBERNETES_DEFAULT_MINOR
for _kd_dir in "$KD_ROOT"/tests/cluster/kubernetes/*/; do
  [[ -f $_kd_dir/go.mod ]] && KD_KUBERNETES_MINORS+=" $(basename "$_kd_dir")"
done
KD_KUBERNETES_MINORS=$(echo "$KD_KUBERNETES_MINORS" | tr ' ' '\n' | sort -t. -k1,1nr -k2,2nr | tr '\n' ' ' | sed 's/ $//')

KD_KUBERNETES_MODULE_DIR="$KD_ROOT/tests/cluster"
if [[ -n ${KUBERNETES_VERSION:-} ]]; then
  _kd_want=$(_kd_minor_of "$KUBERNETES_VERSION")
  if [[ ! $_kd_want =~ ^[0-9]+\.[0-9]+$ ]]; then
    echo "versions.sh: KUBERNETES_VERSION=$KUBERNETES_VERSION is not a Kubernetes version (say a minor, e.g. 1.35); supported: $KD_KUBERNETES_MINORS" >&2
    return 1 2>/dev/null || exit 1
  fi
  if [[ $_kd_want != "$KD_KUBERNETES_DEFAULT_MINOR" ]]; then
    KD_KUBERNETES_MODULE_DIR="$KD_ROOT/tests/cluster/kubernetes/$_kd_want"
    if [[ ! -f $KD_KUBERNETES_MODULE_DIR/go.mod ]]; then
      echo "versions.sh: Kubernetes $_kd_want is not one this project tests on; supported: $KD_KUBERNETES_MINORS" >&2
      return 1 2>/dev/null || exit 1
    fi
  fi
fi

KD_KUBERNETES_VERSION=$(_kd_pinned "$KD_KUBERNETES_MODULE_DIR" k8s.io/kubernetes)
KD_ETCD_VERSION=$(_kd_pinned "$KD_KUBERNETES_MODULE_DIR" go.etcd.io/etcd/server/v3)
if [[ -z $KD_KUBERNETES_VERSION || -z $KD_ETCD_VERSION ]]; then
  echo "versions.sh: cannot read the k8s.io/kubernetes and etcd server versions from $KD_KUBERNETES_MODULE_DIR/go.mod" >&2
  return 1 2>/dev/null || exit 1
fi
if [[ -n ${KUBERNETES_VERSION:-} && $KUBERNETES_VERSION =~ ^v?[0-9]+\.[0-9]+\.[0-9]+$ && v${KUBERNETES_VERSION#v} != "$KD_KUBERNETES_VERSION" ]]; then
  echo "versions.sh: KUBERNETES_VERSION=$KUBERNETES_VERSION, but the pinned $(_kd_minor_of "$KD_KUBERNETES_VERSION") release is $KD_KUBERNETES_VERSION (set in ${KD_KUBERNETES_MODULE_DIR#"$KD_ROOT"/}/go.mod)" >&2
  return 1 2>/dev/null || exit 1
fi
KD_KUBERNETES_MINOR=$(_kd_minor_of "$KD_KUBERNETES_VERSION" | tr . _)
_kd_recipe=$(cd "$KD_KUBERNETES_MODULE_DIR" && cat go.mod go.sum "$KD_ROOT/tests/cluster/build-binaries.sh" | sha256sum | cut -c1-10)
KD_BIN_DIR="${KD_CACHE_DIR:-$KD_ROOT/.cache}/kubernetes/$KD_KUBERNETES_VERSION-etcd-$KD_ETCD_VERSION-$_kd_recipe/bin"
export KD_ROOT KD_KUBERNETES_MODULE_DIR KD_KUBERNETES_VERSION KD_KUBERNETES_MINOR \
  KD_KUBERNETES_DEFAULT KD_KUBERNETES_DEFAULT_MINOR KD_KUBERNETES_MINORS KD_ETCD_VERSION KD_BIN_DIR
unset _kd_dir _kd_want _kd_recipe
unset -f _kd_pinned _kd_minor_of
