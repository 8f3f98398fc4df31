#!/usr/bin/env bash
# The wire API stays compatible with the last release's (`make test` runs this): buf breaking,
# PACKAGE rules (proto/buf.yaml), of proto/ against the image of the release recorded in
# proto/released/ (the newest file there). And the check must bite: the same comparison of a
# copy of proto/ with one field renumbered has to fail. The rules for changing the proto are
# proto/kubedispatch/v1/versions.md; a release records its image with
#   tests/proto-compat.sh --record VERSION
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../proto"
buf_bin=$(../tests/tools.sh buf)
buf() { "$buf_bin" "$@"; }

shopt -s nullglob
recorded=(released/v*.json)
shopt -u nullglob
released=
if ((${#recorded[@]} > 0)); then
  released=$(printf '%s\n' "${recorded[@]}" | sort -V | tail -1)
fi

if [[ ${1:-} == --record ]]; then
  version=${2:?usage: tests/proto-compat.sh --record VERSION (for example 0.2.0)}
  workspace=$(../deploy/version.sh)
  [[ $version == "$workspace" ]] || { echo "--record $version: the workspace's version is $workspace" >&2; exit 1; }
  [[ ! -e released/v$version.json ]] || { echo "proto/released/v$version.json exists: a release is recorded once" >&2; exit 1; }
  # What a release records must keep the previous one's promises too.
  [[ -z $released ]] || buf breaking . --against "$released"
  buf build --exclude-source-info -o "released/v$version.json"
  echo "recorded the wire API of $version in proto/released/v$version.json"
  exit 0
fi

[[ -n $released ]] || { echo "no released wire API in proto/released" >&2; exit 1; }
buf breaking . --against "$released"
echo "proto/ is compatible with $released"

# A deliberately breaking change: the session id of PollRequest renumbered.
broken=$(mktemp -d)
trap 'rm -rf "$broken"' EXIT
against=$PWD/$released
cp -r buf.yaml kubedispatch "$broken/"
python3 - "$broken/kubedispatch/v1/dispatcher.proto" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
changed = re.sub(r"(message PollRequest \{.*?string session_id = )1;", r"\g<1>15;", text, count=1, flags=re.S)
assert changed != text, "PollRequest.session_id not found: update this check"
open(path, "w").write(changed)
PY
# Refused for the renumbering itself (not a build or download failure).
if said=$(cd "$broken" && buf breaking . --against "$against" 2>&1); then
  echo "buf breaking accepted a renumbered field: the check does not bite" >&2
  exit 1
fi
if ! grep -q 'PollRequest' <<<"$said" || ! grep -q 'session_id' <<<"$said"; then
  echo "buf breaking failed on the renumbered field for another reason:" >&2
  echo "$said" >&2
  exit 1
fi
echo "a renumbered field is refused, as it must be"
