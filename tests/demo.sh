#!/usr/bin/env bash
# `make demo`: runs kube-dispatch on an embedded default, a local control plane on loopback.
#
# So far the dispatcher is built but the controller SDK, load balancer and example controller
# are not, so there is nothing yet to drive the dispatchers with; until there is, the demo
# starts the control plane, builds the workspace, shows the API server working, and says
# plainly what it did not run.
#
# Environment:
#   KEEP=1   leave the control plane running at the end (stop it with `make cluster-down`)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'demo: %s\n' "$*"; }
cluster=tests/cluster/cluster.sh

started=
if ! $cluster status >/dev/null 2>&1; then started=1; fi
kubeconfig=$($cluster up)
finish() {
  if [[ -n $started && -z ${KEEP:-} ]]; then
    $cluster down >/dev/null 2>&1 || true
    say "stopped the control plane it started (KEEP=1 keeps it running)"
  fi
}
trap finish EXIT
kubectl=("$(tests/cluster/build-binaries.sh --print-dir)/kubectl" --kubeconfig "$kubeconfig")

say "building the workspace"
cargo build --workspace --quiet

say "control plane: $("${kubectl[@]}" version -o json | python3 -c 'import json,sys; print("kube-apiserver", json.load(sys.stdin)["serverVersion"]["gitVersion"])') /readyz=$("${kubectl[@]}" get --raw /readyz)"
ns=kd-demo-$$
"${kubectl[@]}" create namespace "$ns" >/dev/null
for i in $(seq 1 20); do
  "${kubectl[@]}" -n "$ns" create configmap "demo-$i" --from-literal=index="$i" >/dev/null
done
say "created $("${kubectl[@]}" -n "$ns" get configmaps -o name | grep -c demo-) ConfigMaps in namespace $ns"
"${kubectl[@]}" delete namespace "$ns" --wait=false >/dev/null

cat <<SUMMARY

  what ran                         state
  -------------------------------  ----------------------------------------------
  etcd + kube-apiserver + KCM      running on loopback ($kubeconfig)
  workspace build                  ok
  dispatchers                      built (target/debug/kube-dispatch-dispatcher), not started:
                                   no controller SDK yet to connect one (make test drives them)
  load balancer                    not built yet: nothing to run
  example controller               not built yet: nothing to run

SUMMARY
if [[ -n ${KEEP:-} ]]; then
  say "the control plane keeps running; try: ${kubectl[*]} get namespaces"
fi
