#!/usr/bin/env bash
# Installs Prometheus (and promtool) from the distribution's package, for `make demo`: the
# package's binaries are unpacked into .cache/prometheus/<version>/bin (git-ignored; $KD_CACHE_DIR
# moves .cache) without installing the package system-wide, so no service is started and
# nothing outside the project changes. A prometheus already on PATH is used as it is. Prints
# the folder holding the prometheus binary.
#
# Usage: tests/cluster/prometheus.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

if found=$(command -v prometheus 2>/dev/null); then
  dirname "$found"
  exit 0
fi

cache=${KD_CACHE_DIR:-$root/.cache}/prometheus
# The newest unpacked version, if any.
if [[ -d $cache ]]; then
  for dir in $(ls -1d "$cache"/*/bin 2>/dev/null | sort -r); do
    if [[ -x $dir/prometheus ]]; then
      echo "$dir"
      exit 0
    fi
  done
fi

command -v apt-get >/dev/null || {
  echo "prometheus: not installed, and apt-get is not here to fetch the distribution's package; install prometheus and put it on PATH" >&2
  exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "prometheus: fetching the distribution's prometheus package (once)" >&2
if ! (cd "$work" && apt-get download prometheus >/dev/null 2>"$work/err"); then
  # A fresh machine may have no package lists yet.
  apt-get update >/dev/null 2>&1 || true
  (cd "$work" && apt-get download prometheus >/dev/null 2>"$work/err") || {
    echo "prometheus: apt-get download prometheus failed: $(tail -1 "$work/err")" >&2
    exit 1
  }
fi
deb=$(ls "$work"/prometheus_*.deb)
version=$(dpkg-deb -f "$deb" Version)
dpkg-deb -x "$deb" "$work/root"
mkdir -p "$cache/$version.partial/bin"
cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$cache/$version.partial/bin/"
rm -rf "${cache:?}/$version"
mv "$cache/$version.partial" "$cache/$version"
"$cache/$version/bin/prometheus" --version 2>&1 | head -1 | sed 's/^/prometheus: installed /' >&2
echo "$cache/$version/bin"
