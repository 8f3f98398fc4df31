#!/usr/bin/env bash
# `make bench`: builds the binaries as they are shipped (`--profile dist`, into target/dist), runs the dispatch-core micro-benchmark, starts (or
# reuses) the local control plane, then runs the harness, which prints the tables and writes
# them, with plots, into their pages in bench/results/.
#
# Environment (all optional):
#   OBJECTS=1000,10000     object counts          KINDS=config-map,record   kinds of object
#   REPEATS=3              runs of each variant   WRITES=200                timed writes per run
#   VARIANTS=kube-rs,kube-rs-metadata,controller-runtime,controller-runtime-metadata,dispatch-1,dispatch-4,go-dispatch-1
#                          (go-dispatch-N: the controller-runtime controller ported to the Go SDK;
#                          dispatch-paged-N, dispatch-stream-N: the dispatchers listing in pages
#                          of 500 or by streaming instead of whole)
#   LONG=1                 the long mode: OBJECTS=1000,10000,100000, KINDS=config-map, REPEATS=1,
#                          written to the long-mode section (bench/results/)
#   CONTROLLERS=1,5,10     many controllers (`make bench-groups`): K distinct controllers per
#                          scenario, K processes of each incumbent against K groups on one tier;
#                          defaults then OBJECTS=10000, KINDS=config-map, REPEATS=1,
#                          VARIANTS=kube-rs,controller-runtime,dispatch-1, written to the
#                          groups section (bench/results/)
#   NAMESPACES=1000        spread each scenario's objects over this many namespaces, labelled;
#                          every controller watches all namespaces with the label selector
#                          (not with kube-rs-metadata); with CONTROLLERS, written to the
#                          groups-namespaces section (bench/results/)
#   RING_KEY=namespace     the dispatchers' ring key (default: theirs, name)
#   CHILDREN=5             controllers with children (`make bench-owners`): each Record owns
#                          this many ConfigMaps, kept by the controller, and the timed writes
#                          alternate between owners and children; defaults then
#                          OBJECTS=1000,10000, KINDS=record, REPEATS=2,
#                          VARIANTS=kube-rs,controller-runtime,dispatch-1,dispatch-list-1,
#                          written to the owners section (bench/results/) (with NAMESPACES,
#                          the owners-namespaces section: owners spread over namespaces,
#                          their children labelled as they are)
#   INDEX=1                children found through an index (`make bench-index`): CHILDREN=5
#                          and OBJECTS=1000 unless given, REPEATS=2, VARIANTS=kube-rs,
#                          dispatch-index-1,controller-runtime-index,go-dispatch-index-1 (each
#                          reconcile lists its children: from its cache, or on the tier by one
#                          LIST of the namespace), written to the owners-index section
#   GO_SDK=1               the Go SDK (`make bench-go`): defaults then OBJECTS=10000,100000,
#                          KINDS=config-map, REPEATS=2,
#                          VARIANTS=controller-runtime,go-dispatch-1,dispatch-1, written to the
#                          go-sdk section (bench/results/)
#   SCALE=1                the scale run (`make bench-scale`): defaults then
#                          OBJECTS=100000,1000000, KINDS=config-map, OBJECT_BYTES=300,
#                          REPEATS=1, VARIANTS=kube-rs-streaming,controller-runtime,dispatch-1
#                          (kube-rs's default pages do not complete a list of a million
#                          within the API server's compaction interval), written to the
#                          scale section (bench/results/)
#   OBJECT_BYTES=2048      size of each object's data (objects of another size than 2048
#                          bytes get a namespace of their own)
#   MIX=1                  with CONTROLLERS: a mix of resources, the K controllers spread over
#                          KINDS in turn (defaults then KINDS=config-map,record), written to the
#                          groups-mixed section (bench/results/)
# `kube-dispatch-bench compare --help` (target/dist) describes every setting; its other
# KD_BENCH_* variables (e.g. KD_BENCH_DISPATCHERS=1, KD_BENCH_JSON=target/bench/results.json)
# pass through from the environment.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf 'bench: %s\n' "$*"; }
cluster=tests/cluster/cluster.sh

# The command as given, for the results pages.
command="make bench"
vars="LONG NAMESPACES RING_KEY OBJECTS KINDS REPEATS WRITES VARIANTS"
if [[ -n ${CONTROLLERS:-} ]]; then
  command="make bench-groups"
  vars="CONTROLLERS MIX NAMESPACES RING_KEY OBJECTS KINDS REPEATS WRITES VARIANTS"
fi
if [[ -n ${CHILDREN:-} ]]; then
  command="make bench-owners"
  vars="CHILDREN NAMESPACES RING_KEY OBJECTS REPEATS WRITES VARIANTS"
fi
if [[ -n ${INDEX:-} ]]; then
  command="make bench-index"
  vars="CHILDREN OBJECTS REPEATS WRITES VARIANTS"
  : "${CHILDREN:=5}"
fi
if [[ -n ${GO_SDK:-} ]]; then
  command="make bench-go"
  vars="OBJECTS REPEATS WRITES VARIANTS"
fi
if [[ -n ${SCALE:-} ]]; then
  command="make bench-scale"
  vars="OBJECTS OBJECT_BYTES REPEATS WRITES VARIANTS"
fi
for var in $vars; do
  if [[ -n ${!var:-} ]]; then command+=" $var=${!var}"; fi
done
section=default
if [[ -n ${LONG:-} ]]; then
  section=long
  : "${OBJECTS:=1000,10000,100000}" "${KINDS:=config-map}" "${REPEATS:=1}"
fi
if [[ -n ${CONTROLLERS:-} ]]; then
  section=groups
  if [[ -n ${MIX:-} ]]; then : "${KINDS:=config-map,record}"; fi
  : "${OBJECTS:=10000}" "${KINDS:=config-map}" "${REPEATS:=1}"
  : "${VARIANTS:=kube-rs,controller-runtime,dispatch-1}"
  if [[ ${NAMESPACES:-1} != 1 ]]; then section=groups-namespaces; fi
  if [[ -n ${MIX:-} ]]; then section=groups-mixed; fi
elif [[ -n ${MIX:-} ]]; then
  say "MIX needs CONTROLLERS: use make bench-groups MIX=1"
  exit 2
fi
if [[ -n ${GO_SDK:-} ]]; then
  section=go-sdk
  : "${OBJECTS:=10000,100000}" "${KINDS:=config-map}" "${REPEATS:=2}"
  : "${VARIANTS:=controller-runtime,go-dispatch-1,dispatch-1}"
fi
if [[ -n ${SCALE:-} ]]; then
  section=scale
  : "${OBJECTS:=100000,1000000}" "${KINDS:=config-map}" "${OBJECT_BYTES:=300}" "${REPEATS:=1}"
  : "${VARIANTS:=kube-rs-streaming,controller-runtime,dispatch-1}"
fi
if [[ -n ${INDEX:-} ]]; then
  : "${OBJECTS:=1000}" "${REPEATS:=2}"
  : "${VARIANTS:=kube-rs,dispatch-index-1,controller-runtime-index,go-dispatch-index-1}"
fi
if [[ -n ${CHILDREN:-} ]]; then
  section=owners
  if [[ ${NAMESPACES:-1} != 1 ]]; then section=owners-namespaces; fi
  : "${OBJECTS:=1000,10000}" "${KINDS:=record}" "${REPEATS:=2}"
  : "${VARIANTS:=kube-rs,controller-runtime,dispatch-1,dispatch-list-1}"
fi
if [[ -n ${INDEX:-} ]]; then section=owners-index; fi

say "building the binaries as shipped (cargo --profile dist: fat link-time optimisation; the first build links for several minutes)"
cargo build --profile dist --locked --quiet -p kube-dispatch-dispatcher -p kube-dispatch-loadbalancer -p kube-dispatch-bench --bins

say "building the controller-runtime incumbent and its port to the Go SDK"
controller_runtime=$(bench/controller-runtime/build.sh)
controller_runtime_dispatch=$(bench/controller-runtime/build.sh dispatch)

mkdir -p target/bench
say "dispatch core micro-benchmark"
cargo bench --locked --quiet -p kube-dispatch-core --bench dispatch_core | tee target/bench/core.txt

started_cluster=
if ! $cluster status >/dev/null 2>&1; then started_cluster=1; fi
$cluster up >/dev/null
finish() {
  if [[ -n $started_cluster ]]; then
    $cluster down >/dev/null 2>&1 || true
    say "stopped the control plane it started"
  fi
}
trap finish EXIT

KD_BENCH_OBJECTS=${OBJECTS:-1000,10000} \
KD_BENCH_KINDS=${KINDS:-config-map,record} \
KD_BENCH_REPEATS=${REPEATS:-3} \
KD_BENCH_WRITES=${WRITES:-200} \
KD_BENCH_OBJECT_BYTES=${OBJECT_BYTES:-2048} \
KD_BENCH_VARIANTS=${VARIANTS:-kube-rs,kube-rs-metadata,controller-runtime,controller-runtime-metadata,dispatch-1,dispatch-4,go-dispatch-1} \
KD_BENCH_GROUPS=${CONTROLLERS:-1} \
KD_BENCH_CHILDREN=${CHILDREN:-0} \
KD_BENCH_NAMESPACES=${NAMESPACES:-1} \
KD_BENCH_RING_KEY=${RING_KEY:-name} \
KD_BENCH_MIX=$([[ -n ${MIX:-} ]] && echo true || echo false) \
KD_BENCH_CONTROLLER_RUNTIME=$controller_runtime \
KD_BENCH_CONTROLLER_RUNTIME_DISPATCH=$controller_runtime_dispatch \
  target/dist/kube-dispatch-bench compare --section "$section" --command "$command" \
  --core-results target/bench/core.txt
