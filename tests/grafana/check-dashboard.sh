#!/usr/bin/env bash
# Checks deploy/grafana/*.json with real tools, not by eye:
#   1. the dashboard against Grafana's published schema: each file becomes a TypeScript object
#      literal typed as `Dashboard` from the @grafana/schema package and is type-checked with
#      tsc --strict (unknown or misspelt fields, wrong types and missing required fields fail);
#   2. every PromQL expression with Prometheus's own parser (promtool check rules), the
#      dashboard's variables replaced by plain values;
#   3. with KD_EXPORTED_METRICS_DIR set, every metric an expression names against what the
#      tier's processes export: tests/tests/operations/metrics/ writes the names each process showed
#      (exported-metrics-<process>.txt in cargo's test scratch folder, target/tmp).
# The npm packages are installed once into .cache/grafana-schema ($KD_CACHE_DIR moves .cache).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${KD_CACHE_DIR:-$root/.cache}/grafana-schema
schema_version=13.2.3
typescript_version=5.9.3

if [[ ! -x $cache/node_modules/.bin/tsc || ! -f $cache/.installed-$schema_version-$typescript_version ]]; then
  command -v npm >/dev/null || { echo "check-dashboard: npm is needed (once) to install @grafana/schema and typescript" >&2; exit 1; }
  mkdir -p "$cache"
  (cd "$cache" && [[ -f package.json ]] || echo '{"private": true}' > package.json)
  npm install --prefix "$cache" --no-audit --no-fund --loglevel=error \
    "@grafana/schema@$schema_version" "typescript@$typescript_version" >/dev/null
  touch "$cache/.installed-$schema_version-$typescript_version"
fi
promtool="$("$root/tests/cluster/prometheus.sh")/promtool"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for dashboard in "$root"/deploy/grafana/*.json; do
  name=$(basename "$dashboard" .json)
  # 1. Grafana's schema.
  {
    echo "import type { Dashboard } from '@grafana/schema';"
    echo "export const dashboard: Dashboard ="
    cat "$dashboard"
    echo ";"
  } > "$cache/check-$name.ts"
  cat > "$cache/tsconfig-$name.json" <<JSON
{"compilerOptions": {"strict": true, "noEmit": true, "module": "nodenext",
  "moduleResolution": "nodenext", "target": "es2022", "skipLibCheck": true},
 "files": ["check-$name.ts"]}
JSON
  if ! (cd "$cache" && node_modules/.bin/tsc -p "tsconfig-$name.json"); then
    echo "check-dashboard: $name does not match Grafana's dashboard schema (@grafana/schema $schema_version)" >&2
    failed=1
  fi
  # 2 and 3. The queries.
  python3 - "$dashboard" "$work/$name.rules.yml" "$work/$name.metrics" <<'PY'
import json, re, sys
dashboard, rules, metrics = sys.argv[1:4]
d = json.load(open(dashboard))
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
exprs += [v["query"]["query"] for v in d["templating"]["list"] if isinstance(v.get("query"), dict)]
plain = []
for e in exprs:
    e = e.replace("$__rate_interval", "5m")
    e = re.sub(r"\$\w+", ".*", e)
    # label_values() is Grafana's, not PromQL: check the metric it reads.
    m = re.match(r"label_values\((\w+), *\w+\)", e)
    plain.append(m.group(1) if m else e)
with open(rules, "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(plain):
        f.write(f"      - record: dashboard:expr{i}\n        expr: {json.dumps(e)}\n")
names = set()
for e in plain:
    for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=\s*[{\[)])", e):
        if token.startswith(("workqueue_", "controller_runtime_", "kube_dispatch_", "process_")):
            names.add(re.sub(r"_(bucket|sum|count)$", "", token))
open(metrics, "w").write("\n".join(sorted(names)) + "\n")
PY
  if ! "$promtool" check rules "$work/$name.rules.yml" >/dev/null; then
    "$promtool" check rules "$work/$name.rules.yml" >&2 || true
    echo "check-dashboard: $name has a query Prometheus cannot parse" >&2
    failed=1
  fi
  checked="the schema and $(grep -c record "$work/$name.rules.yml") queries"
  if [[ -n ${KD_EXPORTED_METRICS_DIR:-} ]]; then
    exported=$(cat "$KD_EXPORTED_METRICS_DIR"/exported-metrics-{controller,dispatcher,loadbalancer}.txt | sort -u) || {
      echo "check-dashboard: the metric names the tests record are missing from $KD_EXPORTED_METRICS_DIR: run cargo test first" >&2
      exit 1
    }
    unknown=$(comm -23 "$work/$name.metrics" <(echo "$exported"))
    if [[ -n $unknown ]]; then
      echo "check-dashboard: $name queries metrics the tier does not export:" $unknown >&2
      failed=1
    fi
    checked+=" and their $(wc -l < "$work/$name.metrics") metric names"
  fi
  [[ $failed == 1 ]] || echo "check-dashboard: $name: $checked check out"
done
exit $failed
