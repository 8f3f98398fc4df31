#!/usr/bin/env bash
# The SHA-256 of each .proto file the Go stubs are generated from (see generate.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../proto"
sha256sum kubedispatch/v1/dispatcher.proto kubedispatch/v1/loadbalancer.proto
