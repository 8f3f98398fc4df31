#!/usr/bin/env bash
# Tools the test scripts need beyond the toolchains, each installed once and its path printed:
#   tests/tools.sh helm     helm, built from its Go module into .cache/tools ($KD_CACHE_DIR
#                           moves it)
#   tests/tools.sh pyyaml   PyYAML for python3 (from PyPI when missing); prints python3's path
#   tests/tools.sh buf      buf, the release's own binary from the npm registry (@bufbuild/buf)
#                           into .cache/tools: seconds, where building it from its Go module
#                           takes about two minutes on a fresh machine (the fallback without npm)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELM_VERSION=v3.22.0
BUF_VERSION=v1.75.0
case ${1:-} in
  buf)
    tools="${KD_CACHE_DIR:-$root/.cache}/tools/buf-$BUF_VERSION"
    if [[ ! -x $tools/bin/buf ]]; then
      mkdir -p "$tools/bin"
      if command -v npm >/dev/null; then
        echo "tools.sh: installing buf $BUF_VERSION from the npm registry (once)" >&2
        npm install --silent --no-save --no-audit --no-fund --prefix "$tools/npm" \
          "@bufbuild/buf@${BUF_VERSION#v}" >&2
        ln -sf "$tools/npm/node_modules/.bin/buf" "$tools/bin/buf"
      else
        echo "tools.sh: building buf $BUF_VERSION from its Go module (once)" >&2
        GOBIN=$tools/bin go install "github.com/bufbuild/buf/cmd/buf@$BUF_VERSION" >&2
      fi
    fi
    echo "$tools/bin/buf"
    ;;
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
    echo "usage: tests/tools.sh helm|pyyaml|buf" >&2
    exit 2
    ;;
esac
