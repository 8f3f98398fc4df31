#!/usr/bin/env bash
# Checks deploy/prometheus/kube-dispatch-alerts.yaml with Prometheus's own tools, not by eye:
#   1. `promtool check rules`: every expression parses, every template too;
#   2. `promtool test rules` on kube-dispatch-alerts.test.yaml: each alert fires on the series
#      that should make it fire, with its labels and annotations, and on no others;
#   3. each alert has a firing case (an expected alert) and a not-firing case (an evaluation
#      that expects none) in that file;
#   4. each alert's runbook_url is a section of deploy/RUNBOOK.md, and each section there an
#      alert's;
#   5. each metric the rules read is one the tier registers (its name in the Rust or Go
#      sources) and, with KD_EXPORTED_METRICS_DIR set as for check-dashboard.sh, one a process
#      exported in the tests where they recorded it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
promtool="$(tests/cluster/prometheus.sh)/promtool"
rules=deploy/prometheus/kube-dispatch-alerts.yaml
tests=deploy/prometheus/kube-dispatch-alerts.test.yaml
tests/tools.sh pyyaml >/dev/null

"$promtool" check rules "$rules" >/dev/null || { "$promtool" check rules "$rules" >&2; exit 1; }
"$promtool" test rules "$tests" >/dev/null || { "$promtool" test rules "$tests" >&2; exit 1; }

registered=$(grep -rhoE '"(kube_dispatch_[a-z_]+|workqueue_[a-z_]+|controller_runtime_[a-z_]+)"' \
  --include=*.rs --include=*.go dispatcher loadbalancer server telemetry controller-sdk | tr -d '"' | sort -u)
exported=
if [[ -n ${KD_EXPORTED_METRICS_DIR:-} ]]; then
  exported=$(cat "$KD_EXPORTED_METRICS_DIR"/exported-metrics-*.txt | sort -u)
fi

python3 - "$rules" "$tests" deploy/RUNBOOK.md "$registered" "$exported" <<'PY'
import re, sys, yaml
rules_path, tests_path, runbook_path, registered, exported = sys.argv[1:6]
rules = yaml.safe_load(open(rules_path))
tests = yaml.safe_load(open(tests_path))
failures = []
alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
records = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}

# 3. A firing and a not-firing case for each alert.
firing, silent = set(), set()
for t in tests["tests"]:
    for case in t.get("alert_rule_test", []):
        (firing if case.get("exp_alerts") else silent).add(case["alertname"])
for a in alerts:
    name = a["alert"]
    if name not in firing:
        failures.append(f"{name}: no case in {tests_path} where it fires")
    if name not in silent:
        failures.append(f"{name}: no case in {tests_path} where it stays silent")

# 4. Runbook sections, by GitHub's anchors (lower case, punctuation dropped, spaces as dashes).
def anchor(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
sections = {anchor(h) for h in re.findall(r"(?m)^#{2,3} (.+)$", open(runbook_path).read())}
base = "https://github.com/kube-dispatch/kube-dispatch/blob/main/deploy/RUNBOOK.md#"
used = set()
for a in alerts:
    url = a.get("annotations", {}).get("runbook_url", "")
    if not url.startswith(base):
        failures.append(f"{a['alert']}: runbook_url {url!r} is not a section of deploy/RUNBOOK.md")
        continue
    used.add(url[len(base):])
    if url[len(base):] not in sections:
        failures.append(f"{a['alert']}: deploy/RUNBOOK.md has no section #{url[len(base):]}")
for s in sorted(sections - used):
    failures.append(f"deploy/RUNBOOK.md: section #{s} is no alert's runbook")

# 5. The metrics read.
known = set(registered.split()) | {n + "_total" for n in registered.split()} | {n + "_info" for n in registered.split()}
seen = set(exported.split())
names = set()
for g in rules["groups"]:
    for r in g["rules"]:
        for token in re.findall(r"\b(?:kube_dispatch|workqueue|controller_runtime)_[a-z_]+", r["expr"]):
            names.add(re.sub(r"_(bucket|sum|count)$", "", token))
for n in sorted(names):
    if n not in known:
        failures.append(f"the rules read {n}, which nothing registers")
    elif seen and n not in seen:
        print(f"check-alerts: note: {n} was not exported by the processes of the metrics tests")
for f in failures:
    print(f"check-alerts: {f}", file=sys.stderr)
if failures:
    sys.exit(1)
print(f"check-alerts: {len(alerts)} alerts and {len(records)} recording rules parse and pass their tests; "
      f"each fires and stays silent in a case, has its runbook section, and reads {len(names)} registered metrics")
PY
