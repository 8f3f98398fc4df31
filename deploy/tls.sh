#!/usr/bin/env bash
# The TLS Secrets kube-dispatch serves with, for clusters without cert-manager (with it, use
# deploy/components/cert-manager instead). Creates a CA and a serving certificate per server
# role with openssl, keeps them in a directory of yours, and applies:
#   - Secret kube-dispatch-dispatcher-tls (tls.crt, tls.key, ca.crt) in the tier's namespace,
#     which the dispatcher pods mount, for the name kube-dispatch-dispatcher.<namespace>.svc;
#   - Secret kube-dispatch-loadbalancer-tls, the same for the load-balancer pods and the name
#     kube-dispatch-loadbalancer.<namespace>.svc: a load balancer cannot pose as a dispatcher;
#   - ConfigMap kube-dispatch-ca (ca.crt) in the tier's namespace, where kdctl finds it, and in
#     each controller namespace you name, which the controllers' pods mount to verify the tier.
# Run it again to renew the serving certificates: the CA in the directory is reused, so
# controllers keep trusting the tier; the pods pick the new files up without a restart.
#
# Usage: deploy/tls.sh [--dir DIR] [--namespace NS] [--days N] [--controller-namespace NS]...
#   --dir DIR                   where the CA and keys are kept (default ./kube-dispatch-pki);
#                               keep ca.key safe, it signs what controllers trust
#   --namespace NS              the tier's namespace (default kube-dispatch)
#   --days N                    validity of the serving certificates (default 365)
#   --controller-namespace NS   publish the CA to NS (repeat for several)
# Environment: KUBECTL (default kubectl) and its usual KUBECONFIG.
set -euo pipefail

dir=./kube-dispatch-pki
namespace=kube-dispatch
days=365
controllers=()
kubectl=${KUBECTL:-kubectl}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
die() {
  echo "tls.sh: $*" >&2
  exit 1
}

while (($#)); do
  case $1 in
    --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
    --namespace) namespace=${2:?--namespace needs a name}; shift 2 ;;
    --days) days=${2:?--days needs a number}; shift 2 ;;
    --controller-namespace) controllers+=("${2:?--controller-namespace needs a name}"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ $days =~ ^[1-9][0-9]*$ ]] || die "--days must be a positive number, not '$days'"
command -v openssl >/dev/null || die "openssl is needed"

mkdir -p "$dir"
chmod 700 "$dir"
cd "$dir"

if [[ ! -f ca.crt || ! -f ca.key ]]; then
  openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=kube-dispatch-ca" \
    -keyout ca.key -out ca.crt 2>/dev/null
  echo "tls.sh: new CA in $dir/ca.crt (valid 10 years)"
fi
chmod 600 ca.key

# One certificate per server role. Pods are dialled by IP (the Leases publish pod IPs), so
# clients verify dispatchers under kube-dispatch-dispatcher.<namespace>.svc
# (KD_TLS_SERVER_NAME in the manifests), and the load balancer under the name they dial it by
# (its Service), on its leader too.
# ECDSA P-256 keys, as the cert-manager component issues them: a handshake costs the server a
# fraction of what an RSA key costs, which counts when a tier restart reconnects every replica.
serving_certificate() { # role, names
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
    -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature" \
    "extendedKeyUsage=serverAuth" "subjectAltName=$2" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext" ca.srl
  chmod 600 "$1.key"
  echo "tls.sh: $1 certificate for $2, valid $days days"
}
serving_certificate dispatcher "DNS:kube-dispatch-dispatcher.$namespace.svc"
serving_certificate loadbalancer \
  "DNS:kube-dispatch-loadbalancer.$namespace.svc,DNS:kube-dispatch-loadbalancer.$namespace.svc.cluster.local"

ensure_namespace() {
  "$kubectl" create namespace "$1" --dry-run=client -o yaml | "$kubectl" apply -f - >/dev/null
}
ensure_namespace "$namespace"
for role in dispatcher loadbalancer; do
  "$kubectl" create secret generic "kube-dispatch-$role-tls" --namespace "$namespace" \
    --type kubernetes.io/tls --from-file=tls.crt="$role.crt" --from-file=tls.key="$role.key" \
    --from-file=ca.crt --dry-run=client -o yaml | "$kubectl" apply -f -
done
# The CA for kdctl in the tier's namespace, and for the controllers in theirs.
for ns in "$namespace" "${controllers[@]}"; do
  ensure_namespace "$ns"
  "$kubectl" create configmap kube-dispatch-ca --namespace "$ns" --from-file=ca.crt \
    --dry-run=client -o yaml | "$kubectl" apply -f -
done
