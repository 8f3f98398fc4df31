#!/usr/bin/env bash
# Builds the benchmark controller on controller-runtime (main.go, at the versions in go.mod)
# with the machine's Go into .cache/bench/controller-runtime-<digest of the sources>/, once,
# and prints the binary's path. With `dispatch`, builds its port to the kube-dispatch Go SDK
# instead (bench/controller-runtime-dispatch, the SDK's sources in its digest).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
name=controller-runtime
sources=("$here/go.mod" "$here/go.sum" "$here/main.go" "$0")
case ${1:-} in
  "") ;;
  dispatch)
    name=controller-runtime-dispatch
    here=$root/bench/$name
    sources=("$here/go.mod" "$here/go.sum" "$here/main.go" "$0")
    while IFS= read -r f; do sources+=("$f"); done < <(
      find "$root/controller-sdk/go" -name '*.go' -not -name '*_test.go' -o -name 'go.*' | sort)
    ;;
  *) echo "usage: $0 [dispatch]" >&2; exit 2 ;;
esac
digest=$(cat "${sources[@]}" | sha256sum | cut -c1-10)
dir=${KD_CACHE_DIR:-$root/.cache}/bench/$name-$digest
binary=$dir/bench-$name
# One build at a time per name: `make test` starts one in the background while the benchmark
# tests may ask for the same binary; the second waits for the first and finds it built.
mkdir -p "$(dirname "$dir")"
exec 9>"$(dirname "$dir")/$name.lock"
flock 9
if [[ ! -x $binary ]]; then
  command -v go >/dev/null || {
    echo "controller-runtime/build.sh: go is needed to build bench-$name" >&2
    exit 1
  }
  echo "controller-runtime/build.sh: building bench-$name ($(awk '$1 == "sigs.k8s.io/controller-runtime" { print $2 }' "$here/go.mod"))" >&2
  mkdir -p "$dir"
  (cd "$here" && go build -trimpath -ldflags='-s -w' -o "$binary.partial" .)
  mv "$binary.partial" "$binary"
  # Builds of older sources are never used again.
  hex='[0-9a-f]'
  for old in "$(dirname "$dir")"/$name-$hex$hex$hex$hex$hex$hex$hex$hex$hex$hex; do
    [[ $old == "$dir" ]] || rm -rf "$old"
  done
fi
echo "$binary"
