#!/usr/bin/env bash
# Prints the directory holding cargo-nextest, the test runner `make test` uses for its
# deadlines (.config/nextest.toml), after building it there if it is missing: pinned, from
# crates.io with its lockfile, into .cache/tools (git-ignored; $KD_CACHE_DIR moves it). Built
# once, in a few minutes; reused after that.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=0.9.151
dir="${KD_CACHE_DIR:-$root/.cache}/tools/cargo-nextest-$version"
if [[ ! -x $dir/bin/cargo-nextest ]]; then
  echo "nextest.sh: building cargo-nextest $version into $dir" >&2
  # Unoptimised (--debug): it builds in about half the time, and what it does (start test
  # processes, read their output) does not need the optimiser.
  cargo install cargo-nextest --version "$version" --locked --debug --root "$dir" --quiet >&2
fi
echo "$dir/bin"
