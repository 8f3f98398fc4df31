#!/usr/bin/env bash
# `make test-skew`: version skew, for real. The newest release older than this tree's version
# (deploy/releases) is built from its commit (a git worktree in .cache/skew/<version>, its own
# deploy/image.sh: the tier's image, whose configmap-hasher is built with that release's Rust
# SDK, and the Go example's, built with that release's Go SDK); then tests/e2e.py installs that
# release on the real node with its chart, runs both example controllers of that release, and
# upgrades the tier to this tree with `helm upgrade` while a writer runs, scales the old Rust
# controller 2 -> 1 on the new tier, and downgrades the tier to that release again with
# `helm rollback`: lost 0 and concurrent 0 in every phase, or this fails.
#
# Environment: as tests/e2e.sh (E2E_OBJECTS, E2E_WRITE_RATE, KEEP=1); SKEW_FROM=<version> picks
# another release of deploy/releases.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf 'skew: %s\n' "$*"; }
die() { say "error: $*" >&2; exit 1; }
# Run as root (the node needs it) on a checkout another user owns: git would refuse it.
git() { command git -c safe.directory='*' "$@"; }

current=$(deploy/version.sh)
if [[ -n ${SKEW_FROM:-} ]]; then
  read -r version commit _ < <(awk -v v="$SKEW_FROM" '$1 == v' deploy/releases) || true
  [[ -n ${version:-} ]] || die "no release $SKEW_FROM in deploy/releases"
else
  # The newest release listed that is not this tree's version.
  read -r version commit _ < <(grep -v '^#' deploy/releases | awk -v v="$current" 'NF && $1 != v' | tail -1) || true
  [[ -n ${version:-} ]] || die "deploy/releases lists no release older than $current: there is nothing to be skewed with"
fi
git cat-file -e "$commit^{commit}" 2>/dev/null ||
  die "release $version's commit $commit is not in this clone (git fetch it first)"

cache=${KD_CACHE_DIR:-$PWD/.cache}/skew
tree=$cache/$version
if [[ -d $tree ]] && [[ $(git -C "$tree" rev-parse HEAD 2>/dev/null) == "$commit" ]]; then
  say "reusing the worktree of $version in $tree"
else
  rm -rf "$tree"
  git worktree prune
  mkdir -p "$cache"
  git worktree add --detach --quiet "$tree" "$commit"
  say "checked out release $version ($commit) in $tree"
fi

# One cargo target folder for both builds: the dependencies both share are built once.
target=${CARGO_TARGET_DIR:-$PWD/target}
images=$target/image/skew-$version
mkdir -p "$images"
say "building release $version's images from its own tree (deploy/image.sh of $commit)"
# Built with the release profile where its image.sh can choose (the shipped dist profile's
# link-time optimisation would add minutes of linking; the code is the same).
profile=()
if grep -q -- '--profile' "$tree/deploy/image.sh"; then profile=(--profile release); fi
(cd "$tree" && CARGO_TARGET_DIR=$target deploy/image.sh "${profile[@]}" --tag "kube-dispatch:$version" \
  --output "$images/kube-dispatch.oci.tar" >/dev/null)
(cd "$tree" && CARGO_TARGET_DIR=$target deploy/image.sh --go-example \
  --tag "kube-dispatch-go-hasher:$version" --output "$images/go-hasher.oci.tar" >/dev/null)

say "upgrading $version to this tree ($current, $(git rev-parse --short=12 HEAD)) on the real node"
E2E_FROM_ROOT=$tree E2E_FROM_VERSION=$version \
  E2E_FROM_IMAGES="$images/kube-dispatch.oci.tar $images/go-hasher.oci.tar" \
  tests/e2e.sh
