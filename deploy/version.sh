#!/usr/bin/env bash
# Prints kube-dispatch's version: the workspace's ([workspace.package] version in Cargo.toml),
# the one version of the dispatcher, the load balancer, kdctl, both SDKs and the chart
# (proto/kubedispatch/v1/versions.md). deploy/image.sh and the tests read it from here.
set -euo pipefail
cargo_toml="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/Cargo.toml"
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$cargo_toml")
[[ -n $version ]] || { echo "version.sh: no version in $cargo_toml ([workspace.package] version)" >&2; exit 1; }
echo "$version"
