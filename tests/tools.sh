#!/usr/bin/env bash
# Tools the test scripts need beyond the toolchains, each installed once and its path printed:
#   tests/tools.sh helm     helm, built from its Go module into .cache/tools ($KD_CACHE_DIR
#                           moves it)
#   tests/tools.sh pyyaml   PyYAML for python3 (from PyPI when missing); prints python3's path
#   tests/tools.sh buf      buf, the release's binary from the npm registry (the platform
#                           package of @bufbuild/buf) into .cache/tools: seconds, where building
#                           it from its Go module (the fallback without npm or its registry)
#                           takes about two minutes on a fresh machine
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELM_VERSION=v3.22.0
BUF_VERSION=v1.75.0
case ${1:-} in
  buf)
    tools=$(mkdir -p "${KD_CACHE_DIR:-$root/.cache}/tools" && cd "${KD_CACHE_DIR:-$root/.cache}/tools" && pwd)/buf-$BUF_VERSION
    bin=$tools/bin/buf
    if [[ $("$bin" --version 2>/dev/null) != "${BUF_VERSION#v}" ]]; then
      rm -rf "$tools"
      mkdir -p "$tools/bin"
      case $(uname -m) in
        x86_64) platform=linux-x64 ;;
        aarch64 | arm64) platform=linux-aarch64 ;;
        *) platform= ;;
      esac
      echo "tools.sh: installing buf $BUF_VERSION (once)" >&2
      # The platform package holds the release's binary itself (the @bufbuild/buf package only
      # adds a node wrapper around it).
      if [[ -n $platform ]] && command -v npm >/dev/null &&
        npm install --loglevel=error --no-save --no-audit --no-fund --prefix "$tools/npm" \
          "@bufbuild/buf-$platform@${BUF_VERSION#v}" >&2; then
        ln -sf "$tools/npm/node_modules/@bufbuild/buf-$platform/bin/buf" "$bin"
      else
        echo "tools.sh: no buf from npm; building it from its Go module" >&2
        GOBIN=$tools/bin go install "github.com/bufbuild/buf/cmd/buf@$BUF_VERSION" >&2
      fi
      [[ $("$bin" --version 2>/dev/null) == "${BUF_VERSION#v}" ]] ||
        { echo "tools.sh: $bin is not buf ${BUF_VERSION#v}" >&2; exit 1; }
    fi
    echo "$bin"
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
