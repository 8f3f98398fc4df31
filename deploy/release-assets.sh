#!/usr/bin/env bash
# The release assets the Go SDK's tests fetch (controller-sdk/go/dispatchtest, and the command
# setup-kube-dispatch), as setup-envtest fetches envtest's: the static (musl) dispatcher and
# load balancer in one archive per platform, beside its SHA-256,
#
#   <output>/kube-dispatch-<version>-linux-amd64.tar.gz         (both binaries at its top)
#   <output>/kube-dispatch-<version>-linux-amd64.tar.gz.sha256  (sha256sum's line)
#
# A release publishes both under <assets URL>/v<version>/ (dispatchtest.DefaultBinaryAssetsURL:
# the project's GitHub releases). `make test` makes them with the e2e profile and fetches them
# from a loopback server as a controller's tests would.
#
# Usage: deploy/release-assets.sh [--profile NAME] [--output DIR]
#   --profile  the cargo profile of the binaries (default dist; see deploy/image.sh)
#   --output   where the archive and its checksum go (default target/release-assets, under
#              CARGO_TARGET_DIR when set)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
profile=dist
output=$target_dir/release-assets
while (($#)); do
  case $1 in
    --profile) profile=${2:?--profile needs a name}; shift 2 ;;
    --output) output=${2:?--output needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "release-assets: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

version=$("$root/deploy/version.sh")
"$root/deploy/image.sh" --binaries-only --profile "$profile" >&2
binaries=$target_dir/x86_64-unknown-linux-musl/$profile
name=kube-dispatch-$version-linux-amd64.tar.gz
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$binaries/kube-dispatch-dispatcher" "$binaries/kube-dispatch-loadbalancer" "$stage/"
strip "$stage"/*
mkdir -p "$output"
tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "$output/$name" \
  kube-dispatch-dispatcher kube-dispatch-loadbalancer
(cd "$output" && sha256sum "$name" >"$name.sha256")
echo "$output/$name"
