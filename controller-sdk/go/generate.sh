#!/usr/bin/env bash
# Regenerates the Go stubs of the wire API (internal/wire) from proto/ with buf and the
# protoc-gen-go and protoc-gen-go-grpc tools this module pins, and records the hashes of the
# .proto files they came from (internal/wire/SOURCES), which `make test` checks
# (tests/go-sdk.sh): a .proto changed without the stubs fails the tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
buf=$(../../tests/tools.sh buf)
rm -rf internal/wire/kubedispatch
"$buf" generate
./sources.sh > internal/wire/SOURCES
gofmt -l internal/wire
echo "stubs written to internal/wire"
