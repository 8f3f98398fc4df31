#!/usr/bin/env bash
# `make demo`: runs kube-dispatch on an embedded default, on one machine: a local control plane
# on loopback, three dispatchers (dispatcher-0..2, the identities the StatefulSet gives them) and
# two replicas of the example controller `configmap_hasher`, which keeps a content-hash
# annotation on every ConfigMap. It creates ConfigMaps, waits until every one is annotated,
# kills one controller replica with SIGKILL, changes every ConfigMap, and checks that every
# annotation matches its new content: nothing lost.
#
# Not in it yet: the load balancer (replicas are given the dispatcher addresses), killing and
# adding dispatchers (ring membership comes with a later step).
#
# Environment:
#   DEMO_OBJECTS=N   ConfigMaps to create (default 300)
#   KEEP=1           leave everything running at the end (stop with `make cluster-down` and
#                    `pkill -f kube-dispatch-dispatcher; pkill -f configmap_hasher`)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

objects=${DEMO_OBJECTS:-300}
say() { printf 'demo: %s\n' "$*"; }
cluster=tests/cluster/cluster.sh

started_cluster=
if ! $cluster status >/dev/null 2>&1; then started_cluster=1; fi
kubeconfig=$($cluster up)
kubectl=("$(tests/cluster/build-binaries.sh --print-dir)/kubectl" --kubeconfig "$kubeconfig")
logs=.cluster/logs/demo
mkdir -p "$logs"
pids=()
ns=kd-demo
finish() {
  if [[ -n ${KEEP:-} ]]; then
    say "left running (KEEP=1): dispatchers and controller replicas, logs in $logs"
    return
  fi
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  "${kubectl[@]}" delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  if [[ -n $started_cluster ]]; then
    $cluster down >/dev/null 2>&1 || true
    say "stopped the control plane it started"
  fi
}
trap finish EXIT

say "building the dispatcher and the example controller"
cargo build --quiet -p kube-dispatch-dispatcher -p kube-dispatch-controller --bins --examples
dispatcher_bin=target/debug/kube-dispatch-dispatcher
controller_bin=target/debug/examples/configmap_hasher

read -r -a ports <<<"$(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')"
members=dispatcher-0,dispatcher-1,dispatcher-2
addresses=()
for i in 0 1 2; do
  KD_DISPATCHER_ID=dispatcher-$i KD_RING_MEMBERS=$members KD_LISTEN=127.0.0.1:${ports[$i]} \
    KUBECONFIG=$kubeconfig RUST_LOG=info \
    "$dispatcher_bin" >"$logs/dispatcher-$i.log" 2>&1 &
  pids+=($!)
  addresses+=("http://127.0.0.1:${ports[$i]}")
done
start_replica() {
  POD_NAME=configmap-hasher-$1 KUBECONFIG=$kubeconfig RUST_LOG=info \
    "$controller_bin" "${addresses[@]}" >"$logs/configmap-hasher-$1.log" 2>&1 &
  echo $!
}
replica0=$(start_replica 0)
replica1=$(start_replica 1)
pids+=("$replica0" "$replica1")
say "3 dispatchers on ports ${ports[*]}, 2 controller replicas (logs in $logs)"

# One server-side apply for all objects: a List of ConfigMaps whose data carries a generation
# marker. (Client-side apply of an update computes a three-way merge per object and is several
# times slower than the controllers it is meant to exercise.)
apply_objects() {
  local ssa=(apply --server-side --force-conflicts --field-manager kd-demo -f -)
  python3 - "$objects" "$ns" "$1" <<'EOF' | "${kubectl[@]}" "${ssa[@]}" >/dev/null
import json, sys
n, ns, gen = int(sys.argv[1]), sys.argv[2], sys.argv[3]
items = [{"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": f"demo-{i:05d}", "namespace": ns},
          "data": {"index": str(i), "generation": gen}} for i in range(n)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
EOF
}

# Prints "<matching> <total>": ConfigMaps whose annotation is the hash of their current data.
count_matching() {
  "${kubectl[@]}" -n "$ns" get configmaps -o json | python3 -c '
import hashlib, json, sys
items = [i for i in json.load(sys.stdin)["items"] if i["metadata"]["name"].startswith("demo-")]
def h(data):
    d = hashlib.sha256()
    for k in sorted(data):
        d.update(k.encode() + b"\0" + data[k].encode() + b"\0")
    return d.hexdigest()
ok = sum(1 for i in items
         if i["metadata"].get("annotations", {}).get("example.kube-dispatch.dev/content-hash") == h(i.get("data", {})))
print(ok, len(items))'
}

now_ms() { date +%s%3N; }
seconds_since() { python3 -c "print(f'{($(now_ms) - $1) / 1000:.1f}')"; }

# Waits until every ConfigMap is annotated with its current hash, printing progress.
wait_converged() {
  local deadline=$((SECONDS + 180)) ok total
  while :; do
    read -r ok total <<<"$(count_matching)"
    printf '\rdemo:   %5d / %d ConfigMaps reconciled to their current content' "$ok" "$objects" >&2
    if ((ok == objects && total == objects)); then
      printf '\n' >&2
      return 0
    fi
    if ((SECONDS > deadline)); then
      printf '\n' >&2
      say "not converged after 180 s: $ok of $objects"
      return 1
    fi
    sleep 0.5
  done
}

reconciles() { grep -c 'annotated' "$logs/configmap-hasher-$1.log" 2>/dev/null || true; }

"${kubectl[@]}" create namespace "$ns" >/dev/null 2>&1 || true
say "creating $objects ConfigMaps in namespace $ns"
t0=$(now_ms)
apply_objects 1
wait_converged
first=$(seconds_since "$t0")
r0=$(reconciles 0)
r1=$(reconciles 1)
say "all reconciled ${first} s after the first create: configmap-hasher-0 did $r0, configmap-hasher-1 did $r1"

say "killing configmap-hasher-0 (SIGKILL) and changing every ConfigMap"
t1=$(now_ms)
kill -KILL "$replica0"
apply_objects 2
wait_converged
second=$(seconds_since "$t1")
read -r ok total <<<"$(count_matching)"
lost=$((objects - ok))
r1_after=$(reconciles 1)

cat <<SUMMARY

  kube-dispatch demo                          result
  ------------------------------------------  ------------------------------
  ConfigMaps                                  $objects
  dispatchers                                 3 (dispatcher-0..2, one ring)
  controller replicas                         2, then 1 after SIGKILL
  created and all reconciled in               ${first} s (replica 0: $r0, replica 1: $r1)
  from the kill to all changes reconciled     ${second} s (replica 1: $((r1_after - r1)) more;
                                              the dead replica's keys wait for its 10 s ttl)
  lost (annotation not matching content)      $lost

SUMMARY
((lost == 0))
