#!/usr/bin/env bash
# The Helm chart (deploy/helm/kube-dispatch), as `make test` checks it:
#   1. its templates are current with deploy/base and deploy/components (render.py --check):
#      the chart and the Kustomize base are one source and cannot drift apart; its version and
#      appVersion are the workspace's (Cargo.toml);
#   2. `helm lint`;
#   3. with the defaults (and image.tag dev), `helm template` renders the very objects
#      `kubectl kustomize deploy/base` builds, and with tls.certManager and
#      monitoring.podMonitor on, those of deploy/examples/cert-manager and the monitoring
#      component (Helm's own labels aside; the Namespace is Helm's --create-namespace);
#   4. what it renders, with watchedResources set, passes `kubectl apply --dry-run=server`
#      against the real API server (tests/cluster/cluster.sh up).
# helm is built from its Go module into .cache/tools, once (tests/tools.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
helm=$(tests/tools.sh helm)
tests/tools.sh pyyaml >/dev/null
eval "$(tests/cluster/cluster.sh env)"
export KUBECONFIG
kubectl=$KD_KUBECTL
chart=deploy/helm/kube-dispatch
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Helm keeps its caches and config out of $HOME.
export HELM_CACHE_HOME=$work/cache HELM_CONFIG_HOME=$work/config HELM_DATA_HOME=$work/data

python3 deploy/helm/render.py --check
version=$(deploy/version.sh)
for field in 'version: ' 'appVersion: "'; do
  grep -qx "$field$version\"\{0,1\}" $chart/Chart.yaml || {
    echo "$chart/Chart.yaml: ${field%%:*} must be the workspace's version $version (Cargo.toml)" >&2
    exit 1
  }
done
"$helm" lint --strict "$chart"

# The chart asks for Kubernetes 1.35 or newer: render for the version the tests run.
kube_version=$("$kubectl" version --client -o json | python3 -c "import json,sys; print(json.load(sys.stdin)[\"clientVersion\"][\"gitVersion\"])")
template() {
  "$helm" template kube-dispatch "$chart" --namespace "${namespace:-kube-dispatch}" \
    --kube-version "$kube_version" --set image.tag=dev "$@"
}
template >"$work/chart.yaml"
"$kubectl" kustomize deploy/base >"$work/base.yaml"
python3 tests/same-objects.py "$work/chart.yaml" "$work/base.yaml"
template --set tls.certManager.enabled=true --set monitoring.podMonitor.enabled=true \
  --set monitoring.prometheusRule.enabled=true >"$work/chart-all.yaml"
{
  "$kubectl" kustomize deploy/examples/cert-manager
  # The monitoring component alone, in the tier's namespace as the chart puts it.
  for component in podmonitor prometheusrule; do
    echo ---
    sed 's/^metadata:$/metadata:\n  namespace: kube-dispatch\n  labels:\n    app.kubernetes.io\/part-of: kube-dispatch/' \
      "deploy/components/monitoring/$component.yaml"
  done
} >"$work/base-all.yaml"
python3 tests/same-objects.py "$work/chart-all.yaml" "$work/base-all.yaml"
# The alerts with values of their own: each lands where it should, and the rules still parse.
template --set monitoring.prometheusRule.enabled=true --set-json monitoring.prometheusRule.slo.latencySeconds=2.5 \
  --set monitoring.prometheusRule.keyWaiting.seconds=120 --set monitoring.prometheusRule.mixedVersions.for=3h \
  --set monitoring.prometheusRule.runbookURL=https://runbooks.example/kd.md \
  --show-only templates/prometheusrule.yaml >"$work/rule.yaml"
for wanted in 'le=~"2.5(\\.0)?"' 'kube_dispatch_group_oldest_ready_seconds > 120' 'for: 3h' \
  'runbook_url: https://runbooks.example/kd.md#kubedispatchkeywaiting' '{{ $labels.instance }} failed'; do
  grep -qF -- "$wanted" "$work/rule.yaml" || { echo "helm.sh: the PrometheusRule rendered without $wanted" >&2; exit 1; }
done
python3 -c 'import sys, yaml; yaml.safe_dump(yaml.safe_load(open(sys.argv[1]))["spec"], open(sys.argv[2], "w"))' \
  "$work/rule.yaml" "$work/rules.yaml"
"$(tests/cluster/prometheus.sh)/promtool" check rules "$work/rules.yaml" >/dev/null

# The API server takes what the chart renders, into a namespace of this check's own (made first,
# as --create-namespace would; deleted at the end, so the tests that install deploy/ into
# kube-dispatch find nothing of it).
check_namespace=kube-dispatch-helm-check
"$kubectl" create namespace "$check_namespace" --dry-run=client -o yaml | "$kubectl" apply -f - >/dev/null
trap 'rm -rf "$work"; "$kubectl" delete namespace "$check_namespace" --wait=false >/dev/null 2>&1 || true' EXIT
namespace=$check_namespace
template --set-json 'watchedResources=[{"apiGroups": [""], "resources": ["configmaps", "secrets"]}]' \
  --set dispatcher.ringKey=namespace --set dispatcher.replicas=20 --set 'imagePullSecrets[0].name=regcred' \
  --set dispatcher.nodeSelector.disk=ssd --set 'loadbalancer.tolerations[0].operator=Exists' \
  --set dispatcher.podAnnotations.team=platform --set dispatcher.priorityClassName=system-cluster-critical \
  >"$work/chart-watched.yaml"
for wanted in "kube-dispatch-dispatcher-kube-dispatch-watched" "kube-dispatch-dispatcher.$namespace.svc" 'apiGroups: [""]' \
  'resources: ["configmaps","secrets"]' '--ring-key, "namespace"' \
  "- kube-dispatch-dispatcher-19" "name: regcred" "disk: ssd" "team: platform"; do
  grep -qF -- "$wanted" "$work/chart-watched.yaml" || { echo "helm.sh: rendered without $wanted" >&2; exit 1; }
done
"$kubectl" apply --dry-run=server -f "$work/chart-watched.yaml" >/dev/null
namespace=
# values.schema.json refuses what the tier cannot run.
# (A group written `{""}` with --set is the two-character string "", not the core group.)
for bad in dispatcher.ringKey=sideways dispatcher.replicas=0 networkPolicy.enabled=false \
  'watchedResources[0].apiGroups={""}' monitoring.prometheusRule.slo.latencySeconds=2 \
  monitoring.prometheusRule.keyWaiting.for=soon ; do
  if template --set "$bad" >/dev/null 2>&1; then
    echo "helm.sh: the chart accepted --set $bad" >&2
    exit 1
  fi
done
echo "helm.sh: chart current with deploy/, lint clean, same objects as kustomize, accepted by the API server"
