#!/usr/bin/env bash
# Tools the test scripts need beyond the toolchains, each installed once and its path printed:
#   tests/tools.sh helm     helm, built from its Go module into .cache/tools ($KD_CACHE_DIR
#                           moves it)
#   tests/tools.sh pyyaml   PyYAML for python3 (from PyPI when missing); prints python3's path
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELM_VERSION=v3.22.0
case ${1:-} in
  helm)
    tools="${KD_CACHE_DIR:-$root/.cache}/tools/helm-$HELM_VERSION"
    if [[ ! -x $tools/helm ]]; then
      echo "tools.sh: building helm $HELM_VERSION from its Go module (once)" >&2
      mkdir -p "$tools"
      GOBIN=$tools go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
    fi
    echo "$tools/helm"
    ;;
  pyyaml)
    if ! python3 -c 'import yaml' 2>/dev/null; then
      echo "tools.sh: installing PyYAML for python3" >&2
      python3 -m pip install --quiet --user pyyaml >&2
    fi
    command -v python3
    ;;
  *)
    echo "usage: tests/tools.sh helm|pyyaml" >&2
    exit 2
    ;;
esac
