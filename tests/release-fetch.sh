#!/usr/bin/env bash
# The release archive as a controller's tests fetch it: deploy/release-assets.sh makes the
# archive of the e2e profile's static binaries in a temporary folder laid out as a release
# publishes it, and the Go SDK's test of dispatchtest.DownloadBinaryAssets fetches it from a
# loopback server, checks its SHA-256 and runs both binaries. `make test` runs it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
assets=$(mktemp -d)
trap 'rm -rf "$assets"' EXIT
"$root/deploy/release-assets.sh" --profile e2e --output "$assets/v$("$root/deploy/version.sh")" >/dev/null
cd "$root/controller-sdk/go"
KD_RELEASE_ASSETS="$assets" go test -count=1 -timeout 5m -run TestTheReleaseArchiveIsFetchedAndRuns -v ./dispatchtest/
