#!/usr/bin/env bash
# Builds the benchmark controller on controller-runtime (main.go, at the versions in go.mod)
# with the machine's Go into .cache/bench/controller-runtime-<digest of the sources>/, once,
# and prints the binary's path.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
digest=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" "$0" | sha256sum | cut -c1-10)
dir=${KD_CACHE_DIR:-$root/.cache}/bench/controller-runtime-$digest
binary=$dir/bench-controller-runtime
if [[ ! -x $binary ]]; then
  command -v go >/dev/null || {
    echo "controller-runtime/build.sh: go is needed to build the controller-runtime incumbent" >&2
    exit 1
  }
  echo "controller-runtime/build.sh: building the controller-runtime incumbent ($(awk '$1 == "sigs.k8s.io/controller-runtime" { print $2 }' "$here/go.mod"))" >&2
  mkdir -p "$dir"
  (cd "$here" && go build -trimpath -ldflags='-s -w' -o "$binary.partial" .)
  mv "$binary.partial" "$binary"
  # Builds of older sources are never used again.
  for old in "$(dirname "$dir")"/controller-runtime-*; do
    [[ $old == "$dir" ]] || rm -rf "$old"
  done
fi
echo "$binary"
