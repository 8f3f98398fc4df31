#!/usr/bin/env bash
# One real Kubernetes node on this machine, for `make e2e`: containerd and runc from the
# distribution's packages, a bridge pod network from the distribution's CNI plugins, and
# kubelet, kube-scheduler and kube-proxy built from the pinned modules (build-binaries.sh),
# registered with a control plane of its own (tests/cluster/cluster.sh in .node/cluster, with
# the StatefulSet, Deployment, ReplicaSet, EndpointSlice, disruption and root-CA publisher
# controllers). Needs root: the kubelet makes cgroups and mounts, CNI makes network namespaces.
#
# Usage: tests/node/node.sh <command>
#   up        start the node (or reuse the one running); prints the kubeconfig
#   down      stop it and put the machine back: no process, mount, cgroup, network namespace,
#             iptables chain or kernel setting of the node is left behind
#   status    say whether it is running and Ready (exit 0 if so)
#   env       print shell assignments: KUBECONFIG, KD_KUBECTL, KD_NODE_DIR, KD_CTR
#   import ARCHIVE [NAME...]
#             import an OCI image archive into the node's containerd (no registry involved),
#             also under each NAME (a full reference, docker.io/library/kube-dispatch:dev-2)
#
# The pod network is the bridge kd0 with 10.244.0.1/24 (pods get 10.244.0.2 and up; nothing
# is routed off the machine); kube-apiserver binds 10.244.0.1, so pods reach it through the
# `kubernetes` Service (kube-proxy, iptables mode). There is no cluster DNS: pods resolve names
# the node's /etc/resolv.conf knows, and the e2e overlay adds host aliases for Services.
#
# Everything lives in $KD_NODE_DIR (default <repo>/.node): cluster/ (the control plane),
# containerd/, kubelet/, cni/, logs/ (every component's log, and pods/ with the containers'
# logs), state.env, and cache/ (the pause image; kept by `down`).
#
# Environment:
#   KD_NODE_DIR            where the node lives (default <repo>/.node)
#   KD_NODE_READY_TIMEOUT  seconds to wait for the node to be Ready (default 120)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/versions.sh
source "$here/../cluster/versions.sh"

node_dir=${KD_NODE_DIR:-$KD_ROOT/.node}
mkdir -p "$node_dir"
node_dir=$(cd "$node_dir" && pwd)
ready_timeout=${KD_NODE_READY_TIMEOUT:-120}
state="$node_dir/state.env"
logs="$node_dir/logs"
node_name=kd-node
bridge=kd0
gateway=10.244.0.1
pod_cidr=10.244.0.0/24
run_dir=/run/kd-containerd
sock=$run_dir/containerd.sock
pause_image=kube-dispatch.local/pause:1

export KD_CLUSTER_DIR=$node_dir/cluster
export KD_APISERVER_ADDRESS=$gateway
export KD_KCM_CONTROLLERS=namespace-controller,garbage-collector-controller,serviceaccount-controller,clusterrole-aggregation-controller,statefulset-controller,replicaset-controller,deployment-controller,endpointslice-controller,endpointslice-mirroring-controller,disruption-controller,root-ca-certificate-publisher-controller,pod-garbage-collector-controller,node-lifecycle-controller
cluster=("$KD_ROOT/tests/cluster/cluster.sh")

# Kernel settings the kubelet, kube-proxy or the bridge change; `down` puts them back.
sysctls=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.bridge.bridge-nf-call-iptables net.ipv4.conf.all.route_localnet)

KD_LOG_PREFIX=node
# shellcheck source=tests/cluster/common.sh
source "$here/../cluster/common.sh"

load_state() {
  CONTAINERD_PID= KUBELET_PID= SCHEDULER_PID= PROXY_PID=
  # shellcheck disable=SC1090
  [[ -f $state ]] && source "$state"
  return 0
}

save_state() {
  cat >"$state" <<EOF
CONTAINERD_PID=$CONTAINERD_PID
KUBELET_PID=$KUBELET_PID
SCHEDULER_PID=$SCHEDULER_PID
PROXY_PID=$PROXY_PID
EOF
}

kubectl() { "$KD_BIN_DIR/kubectl" --kubeconfig "$KD_CLUSTER_DIR/kubeconfig" "$@"; }
ctr() { command ctr --address "$sock" --namespace k8s.io "$@"; }

node_ready() {
  load_state
  alive "$CONTAINERD_PID" && alive "$KUBELET_PID" && alive "$SCHEDULER_PID" && alive "$PROXY_PID" &&
    "${cluster[@]}" status >/dev/null 2>&1 &&
    [[ $(kubectl get node "$node_name" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

# The distribution's packages the node runs on, installed when missing.
install_packages() {
  local want=()
  command -v containerd >/dev/null || want+=(containerd)
  command -v runc >/dev/null || want+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || want+=(containernetworking-plugins)
  command -v iptables >/dev/null || want+=(iptables)
  command -v conntrack >/dev/null || want+=(conntrack)
  command -v musl-gcc >/dev/null || want+=(musl-tools)
  command -v buildah >/dev/null || want+=(buildah)
  [[ ${#want[@]} -eq 0 ]] && return 0
  command -v apt-get >/dev/null || die "missing ${want[*]}, and there is no apt-get to install them with"
  log "installing ${want[*]} from the distribution's packages"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${want[@]}" >"$logs/apt.log" 2>&1 ||
    die "apt-get install ${want[*]} failed; see $logs/apt.log"
}

check_machine() {
  [[ $(id -u) == 0 ]] || die "the node needs root (cgroups, mounts, network namespaces)"
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] ||
    die "no memory cgroup at /sys/fs/cgroup: the kubelet cannot run pods here"
  grep -qw overlay /proc/filesystems || die "the kernel has no overlay filesystem (containerd's snapshotter)"
  [[ -d /proc/sys/net/bridge ]] || die "the kernel has no br_netfilter (/proc/sys/net/bridge): Services cannot reach pods on the bridge"
}

save_sysctls() {
  [[ -f $node_dir/sysctl.saved ]] && return 0
  local key
  for key in "${sysctls[@]}"; do
    [[ -e /proc/sys/${key//.//} ]] && echo "$key=$(cat "/proc/sys/${key//.//}")"
  done >"$node_dir/sysctl.saved.new"
  mv "$node_dir/sysctl.saved.new" "$node_dir/sysctl.saved"
}

restore_sysctls() {
  [[ -f $node_dir/sysctl.saved ]] || return 0
  local key value
  while IFS='=' read -r key value; do
    echo "$value" >"/proc/sys/${key//.//}" 2>/dev/null || log "could not restore $key=$value"
  done <"$node_dir/sysctl.saved"
  rm -f "$node_dir/sysctl.saved"
}

make_bridge() {
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
  fi
  ip addr show dev "$bridge" | grep -q "inet $gateway/" || ip addr add "$gateway/24" dev "$bridge"
  ip link set "$bridge" up
  echo 1 >/proc/sys/net/ipv4/ip_forward
  echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
}

# The sandbox image: the static pause program of pause.c, as an OCI archive.
pause_archive() {
  local archive=$node_dir/cache/pause.oci.tar
  local digest
  digest=$(sha256sum "$here/pause.c" | cut -c1-12)
  if [[ -f $archive && -f $archive.src && $(cat "$archive.src") == "$digest" ]]; then
    echo "$archive"
    return 0
  fi
  mkdir -p "$node_dir/cache"
  local work
  work=$(mktemp -d "$node_dir/cache/pause.XXXXXX")
  mkdir -p "$work/rootfs"
  musl-gcc -static -Os -Wall -Wextra -Werror -o "$work/rootfs/pause" "$here/pause.c"
  printf '%s\n' 'FROM scratch' 'COPY rootfs/ /' 'USER 65535:65535' 'ENTRYPOINT ["/pause"]' >"$work/Containerfile"
  "$KD_ROOT/deploy/image.sh" --build-only --context "$work" --file "$work/Containerfile" \
    --tag "$pause_image" --output "$archive" >/dev/null
  echo "$digest" >"$archive.src"
  rm -rf "$work"
  echo "$archive"
}

write_configs() {
  mkdir -p "$node_dir/containerd" "$node_dir/cni/net.d" "$node_dir/kubelet" "$logs/pods"
  cat >"$node_dir/containerd/config.toml" <<EOF
version = 2
root = "$node_dir/containerd/root"
state = "$run_dir"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "$sock"

[ttrpc]
  address = "$sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$node_dir/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  # root here lacks CAP_SYS_RESOURCE: without this runc fails to lower the OOM score.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$node_dir/cni/net.d"
EOF
  cat >"$node_dir/cni/net.d/10-kd-pods.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kd-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$gateway"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$node_dir/cni/ipam"
      }
    }
  ]
}
EOF
  local pki=$KD_CLUSTER_DIR/pki
  local api_port
  api_port=$(awk -F= '$1 == "API_PORT" { print $2 }' "$KD_CLUSTER_DIR/state.env")
  token() { awk -F, -v user="$1" '$2 == user { print $1 }' "$KD_CLUSTER_DIR/tokens.csv"; }
  local who file
  for who in kubelet:system:node:$node_name scheduler:system:kube-scheduler proxy:system:kube-proxy; do
    file=$node_dir/${who%%:*}.kubeconfig
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kd-node
  cluster:
    server: https://$gateway:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: ${who#*:}
  user:
    token: $(token "${who#*:}")
contexts:
- name: kd-node
  context: {cluster: kd-node, user: ${who#*:}}
current-context: kd-node
EOF
    chmod 600 "$file"
  done
  local cgroup_v1=false
  [[ -f /sys/fs/cgroup/cgroup.controllers ]] || cgroup_v1=true
  cat >"$node_dir/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $gateway
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$sock
cgroupDriver: cgroupfs
# This machine has cgroup v1 only ($cgroup_v1 here); the kubelet refuses it unless told.
failCgroupV1: false
failSwapOn: false
podLogsDir: $logs/pods
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podCIDR: $pod_cidr
maxPods: 50
serializeImagePulls: false
# The images are imported, never pulled, and the disk is shared: no eviction for disk.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
protectKernelDefaults: false
shutdownGracePeriod: 0s
EOF
  cat >"$node_dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $pod_cidr
hostnameOverride: $node_name
bindAddress: $gateway
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection: {kubeconfig: $node_dir/proxy.kubeconfig}
conntrack: {maxPerCore: 0, min: 0}
iptables:
  # Pods reach Services on the same bridge: masquerade so replies come back through the NAT.
  masqueradeAll: true
  localhostNodePorts: false
EOF
}

# The node's identity may do what the Node authorizer would let it (RBAC alone here: the
# system:node role), and mint the ServiceAccount tokens its pods project.
grant_node() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kube-dispatch-node-tokens}
rules:
  - {apiGroups: [""], resources: [serviceaccounts/token], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-dispatch-node}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:node:$node_name"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-dispatch-node-tokens}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-dispatch-node-tokens}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:node:$node_name"}]
EOF
}

start_containerd() {
  mkdir -p "$run_dir"
  setsid containerd --config "$node_dir/containerd/config.toml" \
    >>"$logs/containerd.log" 2>&1 </dev/null 9>&- &
  CONTAINERD_PID=$!
  for _ in $(seq 1 100); do
    [[ -S $sock ]] && ctr version >/dev/null 2>&1 && return 0
    alive "$CONTAINERD_PID" || die "containerd exited; see $logs/containerd.log"
    sleep 0.1
  done
  die "containerd did not answer on $sock within 10 s; see $logs/containerd.log"
}

# The archive names its image (org.opencontainers.image.ref.name, a full reference such as
# docker.io/library/kube-dispatch:dev): the kubelet finds it under that name and pulls nothing.
cmd_import() {
  local archive=$1
  [[ -f $archive ]] || die "no such image archive: $archive"
  [[ -S $sock ]] || die "the node's containerd is not running; start the node with: make node-up"
  ctr images import "$archive" >/dev/null
  local from name
  from=$(tar -xOf "$archive" index.json | python3 -c 'import json, sys; print(json.load(sys.stdin)["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])')
  for name in "${@:2}"; do
    ctr images tag --force "$from" "$name" >/dev/null
  done
}

start_kubelet() {
  setsid "$KD_BIN_DIR/kubelet" \
    --config "$node_dir/kubelet/config.yaml" \
    --kubeconfig "$node_dir/kubelet.kubeconfig" \
    --root-dir "$node_dir/kubelet" \
    --hostname-override "$node_name" \
    --node-ip "$gateway" \
    --v 1 \
    >>"$logs/kubelet.log" 2>&1 </dev/null 9>&- &
  KUBELET_PID=$!
}

start_scheduler() {
  setsid "$KD_BIN_DIR/kube-scheduler" \
    --kubeconfig "$node_dir/scheduler.kubeconfig" \
    --authentication-kubeconfig "$node_dir/scheduler.kubeconfig" \
    --authorization-kubeconfig "$node_dir/scheduler.kubeconfig" \
    --leader-elect=false \
    --bind-address 127.0.0.1 \
    --secure-port 0 \
    --v 1 \
    >>"$logs/kube-scheduler.log" 2>&1 </dev/null 9>&- &
  SCHEDULER_PID=$!
}

start_proxy() {
  setsid "$KD_BIN_DIR/kube-proxy" --config "$node_dir/kube-proxy.yaml" --v 1 \
    >>"$logs/kube-proxy.log" 2>&1 </dev/null 9>&- &
  PROXY_PID=$!
}

wait_node_ready() {
  local deadline=$((SECONDS + ready_timeout)) status
  while :; do
    status=$(kubectl get node "$node_name" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
    [[ $status == True ]] && return 0
    alive "$KUBELET_PID" || die "kubelet exited; see $logs/kubelet.log"
    ((SECONDS < deadline)) || die "node $node_name not Ready after ${ready_timeout}s (Ready=${status:-absent}); see $logs/kubelet.log"
    sleep 0.5
  done
}

cmd_up() {
  if node_ready; then
    local running
    running=$(awk -F= '$1 == "KUBERNETES" { print $2 }' "$KD_CLUSTER_DIR/state.env" 2>/dev/null)
    if [[ -n $running && $running != "$KD_KUBERNETES_VERSION" ]]; then
      die "the running node is Kubernetes $running, not $KD_KUBERNETES_VERSION: take it down first (make node-down)"
    fi
    log "reusing the running node $node_name"
    echo "$KD_CLUSTER_DIR/kubeconfig"
    return 0
  fi
  load_state
  if alive "$CONTAINERD_PID" || alive "$KUBELET_PID" || alive "$SCHEDULER_PID" || alive "$PROXY_PID"; then
    log "a previous node is half running; taking it down first"
    cmd_down
  fi
  mkdir -p "$logs"
  check_machine
  install_packages
  "$KD_ROOT/tests/cluster/build-binaries.sh" >/dev/null
  local start=$SECONDS
  save_sysctls
  make_bridge
  "${cluster[@]}" up >/dev/null
  grant_node
  write_configs
  local archive
  archive=$(pause_archive)
  : >"$logs/containerd.log"
  : >"$logs/kubelet.log"
  : >"$logs/kube-scheduler.log"
  : >"$logs/kube-proxy.log"
  KUBELET_PID= SCHEDULER_PID= PROXY_PID=
  start_containerd
  save_state
  cmd_import "$archive"
  start_kubelet
  start_scheduler
  start_proxy
  save_state
  wait_node_ready
  log "node $node_name Ready in $((SECONDS - start)) s: pods on $bridge ($pod_cidr), kube-apiserver https://$gateway, logs in $logs"
  log "try: $KD_BIN_DIR/kubectl --kubeconfig $KD_CLUSTER_DIR/kubeconfig get nodes,pods -A"
  echo "$KD_CLUSTER_DIR/kubeconfig"
}

# Everything below runs even when parts are already gone, so `down` also cleans up after a
# node that crashed or a machine that rebooted.
remove_containers() {
  [[ -S $sock ]] || return 0
  local id
  for id in $(ctr tasks ls -q 2>/dev/null); do
    ctr tasks kill --signal SIGKILL "$id" >/dev/null 2>&1 || true
  done
  for id in $(ctr tasks ls -q 2>/dev/null); do
    for _ in $(seq 1 50); do
      ctr tasks delete "$id" >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
  for id in $(ctr containers ls -q 2>/dev/null); do
    ctr containers delete "$id" >/dev/null 2>&1 || true
  done
}

kill_leftovers() {
  # containerd's shims outlive containerd by design; the node's are the ones on its socket.
  local pids
  pids=$(pgrep -f "containerd-shim.* -address $sock" || true)
  [[ -n $pids ]] && kill -KILL $pids 2>/dev/null || true
  for _ in $(seq 1 50); do
    pgrep -f "containerd-shim.* -address $sock" >/dev/null || return 0
    sleep 0.1
  done
  log "containerd shims still running: $(pgrep -f "containerd-shim.* -address $sock" | tr '\n' ' ')"
}

unmount_all() {
  local mnt
  # Deepest first, so nested mounts (a pod's volumes in its rootfs) come off before their parents.
  for mnt in $(awk -v a="$node_dir/" -v b="$run_dir/" 'index($2, a) == 1 || index($2, b) == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || log "could not unmount $mnt"
  done
}

remove_cgroups() {
  local root dir
  for root in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [[ -d $root/kubepods ]] || continue
    # Leaves first: a cgroup goes only once it has no children and no processes.
    find "$root/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [[ -d $root/kubepods ]] && log "cgroup $root/kubepods still has processes or children"
  done
  for root in /sys/fs/cgroup/*/; do
    for dir in "$root"kubelet "$root"kubelet.slice; do
      [[ -d $dir ]] && find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
  done
}

# The chains kube-proxy and the kubelet make are all named KUBE-*: drop them and every rule
# that jumps to them, and leave the rest of the tables as they were.
remove_iptables() {
  local tool rules
  for tool in iptables ip6tables; do
    command -v "$tool-save" >/dev/null || continue
    rules=$("$tool-save" 2>/dev/null) || continue
    [[ $rules == *KUBE-* ]] || continue
    grep -v -- 'KUBE-' <<<"$rules" | "$tool-restore"
  done
}

cmd_down() {
  load_state
  stop_pid "$KUBELET_PID" kubelet 10
  stop_pid "$SCHEDULER_PID" kube-scheduler
  stop_pid "$PROXY_PID" kube-proxy
  remove_containers
  stop_pid "$CONTAINERD_PID" containerd 10
  kill_leftovers
  unmount_all
  remove_cgroups
  remove_iptables
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip link delete "$bridge"
  fi
  # libcni's cache of the pods' network results (its place is fixed: /var/lib/cni).
  rm -f /var/lib/cni/results/kd-pods-*
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
  restore_sysctls
  "${cluster[@]}" down >/dev/null 2>&1 || true
  rm -rf "$run_dir" "$node_dir/containerd" "$node_dir/kubelet" "$node_dir/cni" "$state" \
    "$node_dir"/*.kubeconfig "$node_dir/kube-proxy.yaml"
  verify_clean
  log "stopped; nothing of the node is left (processes, mounts, cgroups, iptables, bridge); logs kept in $logs"
}

# Fails, naming each, if anything of the node is still there after `down`.
verify_clean() {
  local left=() pids mounts
  pids=$(pgrep -f -- "$node_dir/|$sock" | grep -vx "$$" || true)
  [[ -n $pids ]] && left+=("processes: $(ps -o pid=,args= -p "${pids//$'\n'/,}" | cut -c1-100 | tr '\n' ';')")
  mounts=$(awk -v a="$node_dir/" -v b="$run_dir" 'index($2, a) == 1 || index($2, b) == 1 { print $2 }' /proc/self/mounts)
  [[ -n $mounts ]] && left+=("mounts: ${mounts//$'\n'/ }")
  compgen -G '/sys/fs/cgroup/*/kubepods' >/dev/null && left+=("cgroups: $(echo /sys/fs/cgroup/*/kubepods)")
  [[ -d /sys/fs/cgroup/kubepods ]] && left+=("cgroups: /sys/fs/cgroup/kubepods")
  iptables-save 2>/dev/null | grep -q 'KUBE-' && left+=("iptables chains: $(iptables-save | grep -o '^:KUBE-[A-Z-]*' | tr '\n' ' ')")
  ip link show "$bridge" >/dev/null 2>&1 && left+=("the bridge $bridge")
  compgen -G '/var/lib/cni/results/kd-pods-*' >/dev/null && left+=("CNI results in /var/lib/cni/results")
  [[ ${#left[@]} -eq 0 ]] && return 0
  printf 'node: left behind: %s\n' "${left[@]}" >&2
  die "the node was not cleaned up completely"
}

cmd_status() {
  if node_ready; then
    echo "running: node $node_name Ready (kubelet pid $KUBELET_PID, containerd pid $CONTAINERD_PID); kubeconfig $KD_CLUSTER_DIR/kubeconfig"
  else
    echo "not running"
    return 1
  fi
}

cmd_env() {
  node_ready || die "the node is not running; start it with: make node-up"
  echo "KUBECONFIG=$KD_CLUSTER_DIR/kubeconfig"
  echo "KD_KUBECTL=$KD_BIN_DIR/kubectl"
  echo "KD_NODE_DIR=$node_dir"
  echo "KD_CTR=\"ctr --address $sock --namespace k8s.io\""
}

exec 9>"$node_dir/.lock"
flock 9

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  import)
    [[ -n ${2:-} ]] || die "usage: node.sh import ARCHIVE [NAME...]"
    cmd_import "${@:2}"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
