#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for kube-dispatch's tests, benchmarks and demo:
# etcd, kube-apiserver and kube-controller-manager (for namespace deletion and garbage
# collection), built from the pinned upstream modules by build-binaries.sh.
#
# Usage: tests/cluster/cluster.sh <command>
#   up        start the control plane, or reuse the one already running; prints the kubeconfig
#   down      stop it and remove its data; no process or port is left behind
#   status    say whether it is running and ready (exit 0 if so)
#   env       print shell assignments: KUBECONFIG, KD_KUBECTL, KD_API_URL, KD_ETCD_URL
#   restart-apiserver [--graceful]
#             kill kube-apiserver with SIGKILL, as a crash would (or stop it with SIGTERM), and
#             start it again, keeping etcd and its data; its watch cache starts over, so watches
#             resuming from an older resourceVersion get 410 Gone
#
# KD_APISERVER_PROFILING=true serves the API server's pprof endpoints (off by default), for
# `kube-dispatch-bench compare --profile-apiserver`; it takes effect when the API server starts.
#
# Everything lives in $KD_CLUSTER_DIR (default: <repo>/.cluster):
#   kubeconfig       admin kubeconfig (user "admin", group system:masters)
#   tokens.csv       static bearer tokens: admin, the controller manager, and test identities
#                    kd-test-user-1..5 (no groups, so no permissions until a test grants some)
#   pki/             CA, API server serving certificate, service-account signing key, and
#                    kube-dispatch's serving certificates (kube-dispatch.crt and, to show a
#                    rotation, kube-dispatch-next.crt), for 127.0.0.1, localhost and kube-dispatch
#   tokens/          tester.token: a ServiceAccount token (audience kube-dispatch) of
#                    kube-dispatch-tests/tester, bound to cluster-admin; renewed by `up` once an
#                    hour old (it lives a day)
#   logs/            etcd.log, kube-apiserver.log, kube-controller-manager.log,
#                    control-plane-audit.log
#   data/            etcd data; removed by `down`
#   state.env        ports and process ids of the running control plane, and the audit log
#   audit-policy.yaml what the API server audits: only the list, watch and get requests of
#                    the control plane's own clients (kube-controller-manager, kube-apiserver's
#                    loopback) but on Leases, so that the benchmarks can leave them out of their
#                    request counts (their informers' watches end and start again every 5 to 10
#                    minutes; the garbage collector reads the owners of objects that change)
#
# Environment:
#   KD_CLUSTER_DIR       where the cluster lives (default <repo>/.cluster)
#   KD_READY_TIMEOUT     seconds to wait for /readyz (default 120)
#   KD_APISERVER_ADDRESS the address kube-apiserver binds and advertises (default 127.0.0.1);
#                        the local node (tests/node/node.sh) uses its bridge's address, which
#                        its pods can reach
#   KD_APISERVER_FEATURE_GATES  the API server's --feature-gates (default: ShardedListAndWatch=true
#                        on 1.36 and newer, none on 1.35); set it empty for the release's defaults
#   KUBERNETES_VERSION   the Kubernetes minor to run (default: the newest, tests/cluster/go.mod;
#                        see versions.sh); a control plane of another version already running
#                        in KD_CLUSTER_DIR is refused, not replaced
#   KD_KCM_CONTROLLERS   the controllers kube-controller-manager runs (default: namespace,
#                        garbage collector, service account, ClusterRole aggregation)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/versions.sh
source "$here/versions.sh"

dir=${KD_CLUSTER_DIR:-$KD_ROOT/.cluster}
ready_timeout=${KD_READY_TIMEOUT:-120}
address=${KD_APISERVER_ADDRESS:-127.0.0.1}
kcm_controllers=${KD_KCM_CONTROLLERS:-namespace-controller,garbage-collector-controller,serviceaccount-controller,clusterrole-aggregation-controller}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
state="$dir/state.env"
logs="$dir/logs"
pki="$dir/pki"

KD_LOG_PREFIX=cluster
# shellcheck source=tests/cluster/common.sh
source "$here/common.sh"

load_state() {
  ETCD_PID= APISERVER_PID= KCM_PID= API_PORT= ETCD_PORT= ETCD_PEER_PORT= KUBERNETES=
  # shellcheck disable=SC1090
  [[ -f $state ]] && source "$state"
  return 0
}

save_state() {
  cat >"$state" <<EOF
API_PORT=$API_PORT
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
ETCD_PID=$ETCD_PID
APISERVER_PID=$APISERVER_PID
KCM_PID=$KCM_PID
KUBERNETES=$KD_KUBERNETES_VERSION
AUDIT_LOG=$logs/control-plane-audit.log
EOF
}

# The audit policy: see the header (state.env, audit-policy.yaml).
write_audit_policy() {
  cat >"$dir/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted, Panic]
rules:
  - level: None
    resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
  - level: Metadata
    users: ["system:kube-controller-manager", "system:apiserver"]
    verbs: ["list", "watch", "get"]
  - level: None
EOF
}

# Prints n distinct TCP ports on 127.0.0.1 that are free right now.
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

admin_token() { awk -F, '$2 == "admin" { print $1 }' "$dir/tokens.csv"; }

readyz() {
  curl -fsS --max-time 5 --cacert "$pki/ca.crt" -H "Authorization: Bearer $(admin_token)" \
    "https://$address:$API_PORT/readyz" 2>/dev/null
}

is_ready() {
  load_state
  alive "$ETCD_PID" && alive "$APISERVER_PID" && alive "$KCM_PID" && [[ $(readyz) == ok ]]
}

make_pki() {
  [[ -f $pki/ca.crt && -f $pki/apiserver.crt && -f $pki/sa.key ]] && return 0
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kube-dispatch-test-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
      -keyout apiserver.key -out apiserver.csr 2>/dev/null
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" \
      "subjectAltName=IP:127.0.0.1,IP:$address,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" \
      >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f apiserver.csr apiserver.ext ca.srl
  )
}

# The API server's client certificate for kubelets (logs, exec), in group system:masters.
make_kubelet_client_cert() {
  [[ -f $pki/apiserver-kubelet-client.crt ]] && return 0
  (
    cd "$pki"
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
      -keyout apiserver-kubelet-client.key -out apiserver-kubelet-client.csr 2>/dev/null
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
      "extendedKeyUsage=clientAuth" >apiserver-kubelet-client.ext
    openssl x509 -req -in apiserver-kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -days 3650 -extfile apiserver-kubelet-client.ext -out apiserver-kubelet-client.crt 2>/dev/null
    rm -f apiserver-kubelet-client.csr apiserver-kubelet-client.ext ca.srl
    chmod 600 apiserver-kubelet-client.key
  )
}

# kube-dispatch's serving certificates, signed by the cluster CA (which tests and the demo trust):
# ECDSA P-256 keys, as deploy/ issues them (cert-manager and tls.sh), so that handshakes cost
# here what they cost there. A certificate of another key kind (from an older checkout) is
# made again.
make_dispatch_pki() {
  local name
  for name in kube-dispatch kube-dispatch-next; do
    [[ -f $pki/$name.crt && -f $pki/$name.key &&
      $(openssl x509 -in "$pki/$name.crt" -noout -text) == *id-ecPublicKey* ]] && continue
    (
      cd "$pki"
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$name" \
        -keyout "$name.key" -out "$name.csr" 2>/dev/null
      printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature" \
        "extendedKeyUsage=serverAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kube-dispatch" \
        >"$name.ext"
      openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$name.ext" -out "$name.crt" 2>/dev/null
      rm -f "$name.csr" "$name.ext" ca.srl
      chmod 600 "$name.key"
    )
  done
}

# The identity tests and the demo's tools call kube-dispatch with: a ServiceAccount bound to
# cluster-admin, and a token for audience kube-dispatch.
make_test_identity() {
  local token=$dir/tokens/tester.token kubectl=("$KD_BIN_DIR/kubectl" --kubeconfig "$dir/kubeconfig")
  mkdir -p "$dir/tokens"
  if [[ -s $token ]] && [[ -z $(find "$token" -mmin +60) ]]; then return 0; fi
  "${kubectl[@]}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: kube-dispatch-tests}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: tester, namespace: kube-dispatch-tests}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-dispatch-tester}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: tester, namespace: kube-dispatch-tests}]
EOF
  "${kubectl[@]}" create token tester -n kube-dispatch-tests --audience kube-dispatch \
    --duration 24h >"$token.new"
  chmod 600 "$token.new"
  mv "$token.new" "$token"
}

make_tokens() {
  [[ -f $dir/tokens.csv ]] && return 0
  local t
  t() { openssl rand -hex 24; }
  {
    echo "$(t),admin,kd-admin,\"system:masters\""
    echo "$(t),system:kube-controller-manager,kd-kube-controller-manager,\"system:masters\""
    for i in 1 2 3 4 5; do echo "$(t),kd-test-user-$i,kd-test-user-$i"; done
    # The local node's components (tests/node/node.sh), written before the API server starts.
    echo "$(t),system:node:kd-node,kd-node,\"system:nodes\""
    echo "$(t),system:kube-scheduler,kd-kube-scheduler"
    echo "$(t),system:kube-proxy,kd-kube-proxy"
  } >"$dir/tokens.csv"
  chmod 600 "$dir/tokens.csv"
}

write_kubeconfig() { # file user token
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kube-dispatch-test
  cluster:
    server: https://$address:$API_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: kube-dispatch-test
  context:
    cluster: kube-dispatch-test
    user: $2
current-context: kube-dispatch-test
EOF
  chmod 600 "$1"
}

# The processes run in their own session (setsid), so an interrupt of the command that started
# them (make, cargo test) does not stop the shared control plane, and they do not inherit the
# lock's file descriptor (9).
start_etcd() {
  setsid "$KD_BIN_DIR/etcd" \
    --name kube-dispatch-test \
    --data-dir "$dir/data/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "kube-dispatch-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --quota-backend-bytes $((8 * 1024 * 1024 * 1024)) \
    --unsafe-no-fsync \
    --log-level warn \
    >>"$logs/etcd.log" 2>&1 </dev/null 9>&- &
  ETCD_PID=$!
}

# The feature gates the API server starts with: ShardedListAndWatch (alpha since 1.36, off by
# default) where the release has it, so a ring keyed by namespace is filtered by the server; 1.35
# has no such gate (an unknown gate stops the API server) and shows the dispatcher's fallback.
# KD_APISERVER_FEATURE_GATES replaces the list (empty: the release's defaults).
feature_gates() {
  if [[ -n ${KD_APISERVER_FEATURE_GATES+set} ]]; then
    echo "$KD_APISERVER_FEATURE_GATES"
  elif ((${KD_KUBERNETES_MINOR#*_} >= 36)); then
    echo ShardedListAndWatch=true
  fi
}

start_apiserver() {
  local gates reconciler=()
  gates=$(feature_gates)
  # On loopback nothing in the cluster needs the `kubernetes` Service's endpoints, and from 1.37
  # the API server refuses to publish a loopback address there; the local node (node.sh) binds
  # its bridge's address, which pods reach, and keeps the reconciler.
  [[ $address == 127.* ]] && reconciler=(--endpoint-reconciler-type none)
  setsid "$KD_BIN_DIR/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$address" \
    --advertise-address "$address" \
    --secure-port "$API_PORT" \
    --cert-dir "$pki" \
    --tls-cert-file "$pki/apiserver.crt" \
    --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --token-auth-file "$dir/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    ${gates:+--feature-gates "$gates"} \
    "${reconciler[@]}" \
    --audit-policy-file "$dir/audit-policy.yaml" \
    --audit-log-path "$logs/control-plane-audit.log" \
    --audit-log-format json \
    --audit-log-maxsize 64 \
    --audit-log-maxbackup 1 \
    --profiling="${KD_APISERVER_PROFILING:-false}" \
    --v 1 \
    >>"$logs/kube-apiserver.log" 2>&1 </dev/null 9>&- &
  APISERVER_PID=$!
}

start_controller_manager() {
  setsid "$KD_BIN_DIR/kube-controller-manager" \
    --kubeconfig "$dir/controller-manager.kubeconfig" \
    --controllers "$kcm_controllers" \
    --root-ca-file "$pki/ca.crt" \
    --leader-elect=false \
    --bind-address 127.0.0.1 \
    --secure-port 0 \
    --concurrent-gc-syncs 5 \
    --v 1 \
    >>"$logs/kube-controller-manager.log" 2>&1 </dev/null 9>&- &
  KCM_PID=$!
}

wait_ready() {
  local deadline=$((SECONDS + ready_timeout))
  until [[ $(readyz) == ok ]]; do
    alive "$ETCD_PID" || die "etcd exited; see $logs/etcd.log"
    alive "$APISERVER_PID" || die "kube-apiserver exited; see $logs/kube-apiserver.log"
    ((SECONDS < deadline)) || die "kube-apiserver not ready after ${ready_timeout}s; see $logs/kube-apiserver.log"
    sleep 0.2
  done
}

cmd_up() {
  load_state
  # Running: reused once it answers /readyz. A slow answer (a machine busy with tests that each
  # call `up`) is waited for, never taken for a broken control plane and torn down.
  if alive "$ETCD_PID" && alive "$APISERVER_PID" && alive "$KCM_PID"; then
    if [[ -n $KUBERNETES && $KUBERNETES != "$KD_KUBERNETES_VERSION" ]]; then
      die "the control plane running in $dir is Kubernetes $KUBERNETES, not $KD_KUBERNETES_VERSION: stop it first (make cluster-down), or give this one another folder (KD_CLUSTER_DIR)"
    fi
    wait_ready
    log "reusing the running control plane (kube-apiserver https://$address:$API_PORT)"
    make_dispatch_pki
    make_test_identity
    echo "$dir/kubeconfig"
    return 0
  fi
  if alive "$ETCD_PID" || alive "$APISERVER_PID" || alive "$KCM_PID"; then
    log "a previous control plane is half running; stopping it first"
    cmd_down >/dev/null
  fi
  # Data another release wrote (or one from before releases were recorded) is not carried over:
  # etcd refuses to start on a newer etcd's data, and the tests expect a fresh cluster anyway.
  if [[ -d $dir/data && $KUBERNETES != "$KD_KUBERNETES_VERSION" ]]; then
    log "removing the data of a control plane of ${KUBERNETES:-an unrecorded version} to start $KD_KUBERNETES_VERSION"
    rm -rf "$dir/data" "$dir/tokens/tester.token"
  fi
  "$here/build-binaries.sh" >/dev/null
  command -v openssl >/dev/null || die "openssl is needed to create the test certificates"
  command -v curl >/dev/null || die "curl is needed to probe /readyz"

  mkdir -p "$logs" "$dir/data"
  : >"$logs/etcd.log"
  : >"$logs/kube-apiserver.log"
  : >"$logs/kube-controller-manager.log"
  : >"$logs/control-plane-audit.log"
  write_audit_policy
  make_pki
  make_kubelet_client_cert
  make_tokens
  read -r API_PORT ETCD_PORT ETCD_PEER_PORT <<<"$(free_ports 3)"
  write_kubeconfig "$dir/kubeconfig" admin "$(admin_token)"
  write_kubeconfig "$dir/controller-manager.kubeconfig" system:kube-controller-manager \
    "$(awk -F, '$2 == "system:kube-controller-manager" { print $1 }' "$dir/tokens.csv")"

  local start=$SECONDS
  KCM_PID=
  start_etcd
  start_apiserver
  save_state
  wait_ready
  start_controller_manager
  save_state
  make_dispatch_pki
  make_test_identity
  log "ready in $((SECONDS - start)) s: Kubernetes $KD_KUBERNETES_VERSION, kube-apiserver https://$address:$API_PORT, etcd http://127.0.0.1:$ETCD_PORT, logs in $logs"
  log "try: $KD_BIN_DIR/kubectl --kubeconfig $dir/kubeconfig get --raw /readyz"
  echo "$dir/kubeconfig"
}

cmd_down() {
  load_state
  stop_pid "$KCM_PID" kube-controller-manager
  stop_pid "$APISERVER_PID" kube-apiserver
  stop_pid "$ETCD_PID" etcd
  for port in $API_PORT $ETCD_PORT $ETCD_PEER_PORT; do
    if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
      die "port $port is still listening after stopping the control plane"
    fi
  done
  # The test identity's token names a ServiceAccount that goes with the data.
  rm -rf "$dir/data" "$state" "$dir/kubeconfig" "$dir/controller-manager.kubeconfig" "$dir/tokens/tester.token"
  log "stopped; logs kept in $logs"
}

cmd_status() {
  if is_ready; then
    echo "running: Kubernetes ${KUBERNETES:-?}, kube-apiserver https://$address:$API_PORT (pid $APISERVER_PID), etcd http://127.0.0.1:$ETCD_PORT (pid $ETCD_PID), kube-controller-manager (pid $KCM_PID); kubeconfig $dir/kubeconfig"
  else
    echo "not running"
    return 1
  fi
}

cmd_env() {
  is_ready || die "the control plane is not running; start it with: make cluster-up"
  echo "KUBECONFIG=$dir/kubeconfig"
  echo "KD_KUBECTL=$KD_BIN_DIR/kubectl"
  echo "KD_API_URL=https://$address:$API_PORT"
  echo "KD_ETCD_URL=http://127.0.0.1:$ETCD_PORT"
}

cmd_restart_apiserver() {
  is_ready || die "the control plane is not running; start it with: make cluster-up"
  if [[ ${1:-} == --graceful ]]; then
    stop_pid "$APISERVER_PID" kube-apiserver 30
  else
    kill -KILL "$APISERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 200); do
      alive "$APISERVER_PID" || break
      sleep 0.05
    done
    alive "$APISERVER_PID" && die "kube-apiserver (pid $APISERVER_PID) survived SIGKILL"
  fi
  start_apiserver
  save_state
  wait_ready
  log "kube-apiserver restarted (pid $APISERVER_PID)"
}

# One command at a time per cluster folder, so parallel test processes share one control plane.
exec 9>"$dir/.lock"
flock 9

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  restart-apiserver) cmd_restart_apiserver "${2:-}" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
