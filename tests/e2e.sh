#!/usr/bin/env bash
# `make e2e`: deploy/ on a real node. Starts (or reuses) the local node (tests/node/node.sh:
# kubelet, containerd, runc, kube-scheduler, kube-proxy and a control plane of its own), builds
# the image without a registry (deploy/image.sh) and imports it into the node's containerd as
# kube-dispatch:dev and kube-dispatch:dev-2, and the Go SDK's example controller's image
# (deploy/image.sh --go-example) as kube-dispatch-go-hasher:dev, then tests/e2e.py installs
# the tier with its Helm chart, applies the example controllers (the Rust and the Go one, each
# a group of its own, and both SDKs' ported controllers, deploy/examples/ported-go and
# ported-rust, with a scenario of their own: tests/ported_e2e.py), writes ConfigMaps all along,
# and runs a rolling update of the StatefulSet (helm upgrade), a pod deletion, a dispatcher
# killed with SIGKILL, the load balancer's leader stopped and then killed, a dispatcher's Lease
# writes refused until its alert fires in a Prometheus on this machine (tests/alert_e2e.py), two
# evictions against the PodDisruptionBudget and the controller scaled
# 2 -> 4 -> 1, with a summary per phase (exit status 0 only with lost 0 and concurrent 0
# everywhere, the ported controllers settled, and the alert fired and resolved in time).
#
# Environment:
#   E2E_OBJECTS=N      ConfigMaps the writer changes (default 200)
#   E2E_WRITE_RATE=N   writes per second during each phase (default 20)
#   E2E_SHORT=1        baseline, rolling update, SIGKILL, LB leader, Lease refused, controller
#                      scaled 2 -> 1 (what `make test` runs)
#   E2E_PROFILE=NAME   the cargo profile of the image's binaries (default release; `make test`
#                      gives e2e: unoptimised, built in a fraction of the time)
#   E2E_FROM_ROOT, E2E_FROM_VERSION, E2E_FROM_IMAGES
#                      install a previous release first (its tree, its version, the OCI archives
#                      of its images) and upgrade it to this tree: what `make test-skew` runs
#                      (tests/skew.sh; see tests/e2e.py)
#   KEEP=1             leave the node and the workloads running afterwards
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf 'e2e: %s\n' "$*"; }
node=tests/node/node.sh

# The tier is installed with its Helm chart; the controllers' manifests are read with PyYAML.
KD_HELM=$(tests/tools.sh helm)
export KD_HELM
tests/tools.sh pyyaml >/dev/null
started_node=
if ! $node status >/dev/null 2>&1; then started_node=1; fi
kubeconfig=$($node up)
eval "$($node env)"
finish() {
  local code=$?
  if [[ -n ${KEEP:-} ]]; then
    say "left running (KEEP=1): KUBECONFIG=$kubeconfig; stop with: make node-down"
  elif [[ -n $started_node ]]; then
    $node down >/dev/null 2>&1 || true
    say "took down the node it started"
  else
    # A node that was already running goes on; the workloads go. The ported controllers'
    # objects first, while their controllers still run: a Mirror's finalizer is theirs to lift.
    k=("$KD_KUBECTL" --kubeconfig "$kubeconfig")
    for ns in e2e-ported e2e-ported-rust; do
      if ! "${k[@]}" delete namespace "$ns" --ignore-not-found --timeout=60s >/dev/null 2>&1; then
        # Its controllers did not lift the Mirrors' finalizers (a failed run): lift them here.
        for m in $("${k[@]}" -n "$ns" get mirrors.examples.kube-dispatch.dev -o name 2>/dev/null); do
          "${k[@]}" -n "$ns" patch "$m" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
        done
      fi
    done
    "${k[@]}" delete crd bundles.examples.kube-dispatch.dev mirrors.examples.kube-dispatch.dev --ignore-not-found >/dev/null 2>&1 || true
    "${k[@]}" delete clusterrolebinding,clusterrole ported-controllers-go ported-controllers-rust --ignore-not-found >/dev/null 2>&1 || true
    "${k[@]}" delete clusterrole kube-dispatch-dispatcher-ported-examples kube-dispatch-kdctl-ported-examples --ignore-not-found >/dev/null 2>&1 || true
    # The alert phase's fault, if a failure left it in place.
    "$KD_KUBECTL" --kubeconfig "$kubeconfig" delete validatingadmissionpolicybinding,validatingadmissionpolicy e2e-lease-writes-refused --ignore-not-found >/dev/null 2>&1 || true
    "$KD_HELM" --kubeconfig "$kubeconfig" uninstall kube-dispatch --namespace kube-dispatch >/dev/null 2>&1 || true
    for ns in configmap-hasher configmap-hasher-go ported-go ported-rust e2e-ported e2e-ported-rust; do
      "$KD_KUBECTL" --kubeconfig "$kubeconfig" delete namespace "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    done
    "$KD_KUBECTL" --kubeconfig "$kubeconfig" delete namespace e2e-objects --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  exit $code
}
trap finish EXIT

say "building the image (static binaries, FROM scratch) and importing it into the node"
# The `release` profile (E2E_PROFILE to change it; `make test` uses `e2e`, unoptimised): the
# shipped `dist` profile's link-time optimisation would add about 9 minutes of linking to every
# run; the code is the same.
archive=$(deploy/image.sh --profile "${E2E_PROFILE:-release}")
$node import "$archive" docker.io/library/kube-dispatch:dev-2
say "image $(du -h "$archive" | cut -f1) as an archive; $(tar -xOf "$archive" index.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])')"
say "building the Go example controller's image and importing it into the node"
go_archive=$(deploy/image.sh --go-example)
$node import "$go_archive"

for previous in ${E2E_FROM_IMAGES:-}; do
  say "importing the previous release's image $(basename "$previous")"
  $node import "$previous"
done

# kdctl runs on this machine against the node's tier at the end, with its kubeconfig alone.
# Asked of the whole workspace, as `cargo build --workspace --bins` built it: with `-p` alone
# cargo would unify fewer features and build the dependencies again.
cargo build --workspace --bin kdctl --locked --quiet
KD_CTR=$KD_CTR python3 tests/e2e.py "$kubeconfig" "$KD_KUBECTL" "$KD_NODE_DIR" "$PWD"
