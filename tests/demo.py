"""`make demo`, driven from tests/demo.sh once the binaries and the control plane are ready.

Runs the tier as local processes with the identities the StatefulSet and Deployments would give
them: three dispatchers (dispatcher-0..2, ring from their Leases), the load balancer, and two
replicas of the example controller `configmap_hasher` (configmap-hasher-0/1), which keeps a
content-hash annotation on every ConfigMap. Secure as deployed: every server serves TLS (the
control plane's test certificate), and every call carries a ServiceAccount token for audience
kube-dispatch: the controller's ServiceAccount may list, watch, get and patch ConfigMaps in the
demo's namespace only, and the dispatchers' own ServiceAccount is the only one Peer takes. Then:

1. creates the ConfigMaps and waits until every one carries the hash of its content;
2. kills (SIGKILL) dispatcher-1, changes every ConfigMap, and waits again: the other two take
   its keys over once its Lease has expired and the replicas have reported its sessions ended;
3. kills (SIGKILL) configmap-hasher-0, changes every ConfigMap, and waits again: the other
   replica takes its keys over once its sessions have expired;
4. adds dispatcher-3, changes every ConfigMap once more, and waits again.

It prints progress every second and a summary. "lost" counts ConfigMaps whose annotation does
not match their final content; "concurrent" counts pairs of reconciles of one ConfigMap that
overlapped in time across replicas, read from the replicas' JSON logs (a line when each
reconcile span opens and closes). The demo exits non-zero unless both are 0.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reconciles import annotated, concurrent, spans  # noqa: E402

KUBECONFIG, KUBECTL, BIN_DIR, LOGS, PROMETHEUS_BIN = sys.argv[1:6]
LOGS = os.path.abspath(LOGS)
PKI = os.path.join(os.path.dirname(KUBECONFIG), "pki")
OBJECTS = int(os.environ.get("DEMO_OBJECTS", "2000"))
KEEP = bool(os.environ.get("KEEP"))
# A namespace per run: the previous run's may still be terminating.
OBJECTS_NS = f"kd-demo-{os.getpid()}"
# The Leases of the ring and of the load balancer live beside the objects, so the run leaves
# nothing behind when its namespace goes.
LEASE_NS = OBJECTS_NS
TIMEOUT = 300
# Short Leases and bounds so failover shows within seconds; `T` = max(session ttl cap,
# reconcile cap) = 10 s.
DISPATCHER_ENV = {
    "KD_LEASE_NAMESPACE": LEASE_NS,
    "KD_LEASE_DURATION": "4s",
    "KD_LEASE_RENEW_PERIOD": "1s",
    "KD_LEASE_GRACE": "1s",
    "KD_SESSION_TTL": "5s",
    "KD_MAX_SESSION_TTL": "5s",
    "KD_MAX_POLL_WAIT": "2s",
    "KD_MAX_RECONCILE_TIME": "10s",
    "KD_RESYNC_INTERVAL": "0s",
    "KD_LOG_JSON": "1",
    "KD_STATUS_INTERVAL": "1s",
}
TTY = sys.stdout.isatty()
T0 = time.monotonic()


def say(message):
    print(f"demo: {message}", flush=True)


def kubectl(*args, stdin=None, check=True):
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", KUBECONFIG, *args], input=stdin, capture_output=True, text=True
    )
    if check and done.returncode != 0:
        say(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        raise SystemExit(1)
    return done.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    def __init__(self, name, argv, env):
        self.name = name
        self.log = os.path.join(LOGS, f"{name}.log")
        full = dict(os.environ, KUBECONFIG=KUBECONFIG, RUST_LOG="info", **env)
        self.proc = subprocess.Popen(
            argv, env=full, stdout=open(self.log, "w"), stderr=subprocess.STDOUT
        )
        self.killed_at = None

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.killed_at = datetime.now().timestamp()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self):
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


processes = {}


# Each process's admin endpoint (/metrics), which Prometheus scrapes: name -> port.
admin_ports = {}


def start(name, argv, env):
    if "KD_ADMIN_LISTEN" in env:
        admin_ports[name] = int(env["KD_ADMIN_LISTEN"].rsplit(":", 1)[1])
        write_scrape_targets()
    processes[name] = Process(name, argv, env)
    return processes[name]


def write_scrape_targets():
    """The file Prometheus discovers its targets in (re-read when it changes)."""
    targets = [
        {"targets": [f"127.0.0.1:{port}"],
         "labels": {"process": name, "role": name.rsplit("-", 1)[0]}}
        for name, port in sorted(admin_ports.items())
    ]
    path = os.path.join(LOGS, "prometheus-targets.json")
    with open(path + ".new", "w") as f:
        json.dump(targets, f)
    os.replace(path + ".new", path)


PROMETHEUS = {}


def start_prometheus():
    """Prometheus on loopback, scraping every process's admin endpoint each second."""
    port = free_port()
    config = os.path.join(LOGS, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: kube-dispatch
    file_sd_configs: [{{files: ["{os.path.join(LOGS, 'prometheus-targets.json')}"], refresh_interval: 1s}}]
""")
    write_scrape_targets()
    # A fresh store: series of an earlier run would count as this one's.
    shutil.rmtree(os.path.join(LOGS, "prometheus-data"), ignore_errors=True)
    start("prometheus", [
        os.path.join(PROMETHEUS_BIN, "prometheus"), f"--config.file={config}",
        f"--storage.tsdb.path={os.path.join(LOGS, 'prometheus-data')}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ], {})
    PROMETHEUS["url"] = f"http://127.0.0.1:{port}"
    wait_targets()


def wait_targets():
    """Waits until Prometheus scrapes every live process (a new target takes up to 5 s to be
    discovered), so that what happens next is on record."""
    live = [n for n in admin_ports if processes[n].killed_at is None]
    deadline = time.monotonic() + 60
    up = None
    while time.monotonic() < deadline:
        try:
            up = promql("count(up == 1)")
            if up and int(up[0]["value"][1]) == len(live):
                say(f"Prometheus on {PROMETHEUS['url']} scrapes all {len(live)} processes")
                return
        except OSError:
            pass
        time.sleep(0.2)
    say(f"Prometheus did not scrape all {len(live)} processes within 60 s (count(up == 1): "
        f"{up}); see its log")
    raise SystemExit(1)


def promql(query, **params):
    """The result of a PromQL query (instant, or a range with start/end/step)."""
    path = "/api/v1/query_range" if "step" in params else "/api/v1/query"
    url = PROMETHEUS["url"] + path + "?" + urllib.parse.urlencode(dict(query=query, **params))
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"PromQL {query!r} failed: {body}")
    return body["data"]["result"]


def wait_scraped():
    """Waits until Prometheus has scraped every live process after now."""
    now = time.time()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # timestamp() of a selector is the scrape time (of an expression, the query time).
        seen = promql("min(timestamp(up) and up == 1)")
        if seen and float(seen[0]["value"][1]) >= now:
            return
        time.sleep(0.1)


def prometheus_figures(since):
    """Figures read back through Prometheus's query API, once it has scraped every live process
    after the last change."""
    wait_scraped()
    per_replica = {
        r["metric"]["process"]: int(float(r["value"][1]))
        for r in promql('sum by (process) (max_over_time(controller_runtime_reconcile_total[1h]))')
    }
    depth = promql('sum(workqueue_depth)', start=since, end=time.time(), step="1s")
    points = [(float(t) - since, float(v)) for t, v in depth[0]["values"]] if depth else []
    peak = max(points, key=lambda p: p[1], default=(0.0, 0.0))
    p99 = promql('histogram_quantile(0.99, sum by (le) '
                 '(max_over_time(controller_runtime_reconcile_time_seconds_bucket[1h])))')
    deliveries = {
        r["metric"]["process"]: int(float(r["value"][1]))
        for r in promql('sum by (process) (max_over_time(kube_dispatch_group_deliveries_total[1h]))')
    }
    return per_replica, points, peak, (float(p99[0]["value"][1]) if p99 else float("nan")), deliveries


def sparkline(points, width=60):
    """The queue depth over time as one line of block characters."""
    if not points:
        return ""
    blocks = " ▁▂▃▄▅▆▇█"
    top = max(v for _, v in points) or 1
    step = max(1, len(points) // width)
    sampled = [max(v for _, v in points[i:i + step]) for i in range(0, len(points), step)]
    return "".join(blocks[min(8, round(v / top * 8))] for v in sampled)


def identities():
    """The demo's ServiceAccounts, their rights, and a token for each (audience kube-dispatch).
    Returns the token files by account."""
    kubectl("apply", "-f", "-", stdin=f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: kube-dispatch-dispatcher, namespace: {OBJECTS_NS}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: configmap-hasher, namespace: {OBJECTS_NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: configmap-hasher, namespace: {OBJECTS_NS}}}
rules:
- {{apiGroups: [""], resources: [configmaps], verbs: [get, list, watch, patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: configmap-hasher, namespace: {OBJECTS_NS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-hasher}}
subjects: [{{kind: ServiceAccount, name: configmap-hasher, namespace: {OBJECTS_NS}}}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: kdctl, namespace: {OBJECTS_NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: kube-dispatch-kdctl}}
rules:
- {{nonResourceURLs: [/kube-dispatch/status], verbs: [get]}}
- {{nonResourceURLs: [/kube-dispatch/drain], verbs: [post]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {OBJECTS_NS}-kdctl}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-dispatch-kdctl}}
subjects: [{{kind: ServiceAccount, name: kdctl, namespace: {OBJECTS_NS}}}]
""")
    tokens = {}
    for account in ["kube-dispatch-dispatcher", "configmap-hasher"]:
        token = kubectl("create", "token", account, "-n", OBJECTS_NS, "--audience",
                        "kube-dispatch", "--duration", "1h").strip()
        path = os.path.join(LOGS, f"{account}.token")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(token)
        tokens[account] = path
    return tokens


TOKENS = {}
TLS_ENV = {
    "KD_TLS_CERT_FILE": os.path.join(PKI, "kube-dispatch.crt"),
    "KD_TLS_KEY_FILE": os.path.join(PKI, "kube-dispatch.key"),
    "KD_TLS_CA_FILE": os.path.join(PKI, "ca.crt"),
}


def start_dispatcher(i):
    port = free_port()
    env = dict(DISPATCHER_ENV, **TLS_ENV, KD_DISPATCHER_ID=f"dispatcher-{i}",
               KD_LISTEN=f"127.0.0.1:{port}", KD_ADMIN_LISTEN=f"127.0.0.1:{free_port()}",
               KD_TOKEN_FILE=TOKENS["kube-dispatch-dispatcher"],
               KD_PEER_USERS=f"system:serviceaccount:{OBJECTS_NS}:kube-dispatch-dispatcher")
    return start(f"dispatcher-{i}", [os.path.join(BIN_DIR, "kube-dispatch-dispatcher")], env)


def start_replica(i, lb_port):
    env = {
        "POD_NAME": f"configmap-hasher-{i}",
        "KD_LOADBALANCER": f"127.0.0.1:{lb_port}",
        "KD_LOG_JSON": "1",
        "KD_TLS_CA_FILE": TLS_ENV["KD_TLS_CA_FILE"],
        "KD_TOKEN_FILE": TOKENS["configmap-hasher"],
        "KD_WATCH_NAMESPACE": OBJECTS_NS,
        "KD_ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
    }
    return start(
        f"configmap-hasher-{i}", [os.path.join(BIN_DIR, "examples", "configmap_hasher")], env
    )


def apply_objects(generation):
    items = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"demo-{i:05d}", "namespace": OBJECTS_NS},
            "data": {"index": str(i), "generation": str(generation)},
        }
        for i in range(OBJECTS)
    ]
    kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager", "kd-demo", "-f", "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )


def matching():
    """ConfigMaps whose annotation is the hash of their current content, and the total."""
    items = json.loads(kubectl("-n", OBJECTS_NS, "get", "configmaps", "-o", "json"))["items"]
    items = [i for i in items if i["metadata"]["name"].startswith("demo-")]
    ok = sum(1 for i in items if annotated(i))
    return ok, len(items)


def reconciles():
    """Every reconcile span of the replicas: (replica, key, dispatcher, start, end or None)."""
    runs = []
    for name, p in processes.items():
        if not name.startswith("configmap-hasher"):
            continue
        with open(p.log) as f:
            # A span still open is still running, or was cut short by a kill.
            for key, dispatcher, begun, end in spans(f, cut_at=p.killed_at):
                runs.append((name, key, dispatcher, begun, end))
    return runs


def queue_depth():
    """Per live dispatcher: keys ready for delivery or in flight, from the last `queue status`
    line of each of its controller groups."""
    depth = {}
    for name, p in sorted(processes.items()):
        if not name.startswith("dispatcher") or p.killed_at is not None:
            continue
        groups = {}
        try:
            with open(p.log) as f:
                for line in f:
                    if '"queue status"' not in line:
                        continue
                    try:
                        fields = json.loads(line).get("fields", {})
                    except ValueError:
                        continue
                    groups[fields.get("group")] = fields.get("ready", 0) + fields.get("in_flight", 0)
        except OSError:
            continue
        depth[name] = sum(groups.values())
    return depth


def progress(label, since):
    runs = reconciles()
    per_replica = Counter(r[0] for r in runs)
    per_dispatcher = Counter(dispatcher_names.get(r[2], r[2]) for r in runs if r[3] >= since)
    ok, total = matching()
    line = (
        f"{time.monotonic() - T0:6.1f}s {label}: {ok}/{OBJECTS} reconciled to their content, "
        f"{OBJECTS - ok} pending | replicas "
        + ", ".join(f"{k.rsplit('-', 1)[1]}:{v}" for k, v in sorted(per_replica.items()))
        + " | dispatchers (this phase) "
        + ", ".join(f"{k}:{v}" for k, v in sorted(per_dispatcher.items()))
        + " | queued or in flight "
        + ", ".join(f"{k}:{v}" for k, v in queue_depth().items())
    )
    print(("\r" if TTY else "") + "demo: " + line, end="" if TTY else "\n", flush=True)
    return ok, total


def wait_converged(label, since, writer, failed):
    begin = time.monotonic()
    while True:
        if failed:
            print()
            say(f"writing the ConfigMaps failed: {failed[0]!r}")
            raise SystemExit(1)
        ok, total = progress(label, since)
        if ok == OBJECTS and total == OBJECTS and not writer.is_alive():
            if TTY:
                print()
            return time.monotonic() - begin
        if time.monotonic() - begin > TIMEOUT:
            print()
            say(f"not converged after {TIMEOUT} s: {ok} of {OBJECTS}")
            raise SystemExit(1)
        time.sleep(1)


dispatcher_names = {}


def main():
    os.makedirs(LOGS, exist_ok=True)
    kubectl("create", "namespace", OBJECTS_NS)
    TOKENS.update(identities())

    lb_port = free_port()
    start(
        "loadbalancer",
        [os.path.join(BIN_DIR, "kube-dispatch-loadbalancer")],
        {
            **{k: v for k, v in TLS_ENV.items() if k != "KD_TLS_CA_FILE"},
            "KD_LISTEN": f"127.0.0.1:{lb_port}",
            "KD_ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
            "KD_NAMESPACE": LEASE_NS,
            "KD_LEASE_DURATION": "4s",
            "KD_LEASE_GRACE": "1s",
            "KD_DISPATCHER_GRACE": "1s",
            "KD_REPLICA_GRACE": "3s",
        },
    )
    for i in range(3):
        start_dispatcher(i)
    for i in range(2):
        start_replica(i, lb_port)
    say(f"3 dispatchers, the load balancer on 127.0.0.1:{lb_port}, 2 controller replicas, all over TLS with ServiceAccount tokens; logs in {LOGS}")
    wait_for_addresses()
    start_prometheus()
    demo_began = time.time()

    say(f"creating {OBJECTS} ConfigMaps in namespace {OBJECTS_NS}")
    created = wait_after(lambda: apply_objects(1), "create")

    # So that Prometheus holds what the two processes did before they die.
    wait_scraped()
    say("killing dispatcher-1 (SIGKILL), then changing every ConfigMap")
    processes["dispatcher-1"].kill()
    dispatcher_killed_at = processes["dispatcher-1"].killed_at
    failover = wait_after(lambda: apply_objects(2), "dispatcher failover")
    dispatcher_takeover = takeover(dispatcher_killed_at, dispatcher="dispatcher-1")

    say("killing configmap-hasher-0 (SIGKILL), then changing every ConfigMap")
    processes["configmap-hasher-0"].kill()
    replica_killed_at = processes["configmap-hasher-0"].killed_at
    replica_failover = wait_after(lambda: apply_objects(3), "replica failover")
    replica_takeover = takeover(replica_killed_at, replica="configmap-hasher-0")

    say("adding dispatcher-3, then changing every ConfigMap")
    start_dispatcher(3)
    wait_for_addresses()
    wait_targets()
    scaled = wait_after(lambda: apply_objects(4), "scale-up")
    phase3 = Counter(
        dispatcher_names.get(r[2], r[2]) for r in reconciles() if r[3] >= scaled_since[0]
    )

    runs = reconciles()
    ok, total = matching()
    lost = OBJECTS - ok
    overlaps = concurrent([(replica, key, begun, end) for replica, key, _, begun, end in runs])
    per_replica = Counter(r[0] for r in runs)
    writes = 4 * OBJECTS
    print(
        f"""
  kube-dispatch demo                          result
  ------------------------------------------  ----------------------------------------
  ConfigMaps                                  {OBJECTS}, each written 4 times ({writes} writes)
  reconciles                                  {len(runs)} ({len(runs) / writes:.2f} per write); """
        + ", ".join(f"{k} {v}" for k, v in sorted(per_replica.items()))
        + f"""
  dispatchers                                 dispatcher-0..2, then -1 killed, then -3 added
  created and all reconciled in               {created:.1f} s
  dispatcher SIGKILL, all changes reconciled  {failover:.1f} s
  dispatcher-1's keys served again            {dispatcher_takeover:.1f} s after the kill (its Lease, 4 s + 1 s,
                                                then the replicas' reports of its sessions;
                                                the bound T, 10 s more, when one is silent)
  replica SIGKILL, all changes reconciled     {replica_failover:.1f} s
  configmap-hasher-0's keys served again      {replica_takeover:.1f} s after the kill (its sessions' 5 s ttl,
                                                counted from its last poll)
  dispatcher-3 added, all changes reconciled  {scaled:.1f} s; by dispatcher: """
        + ", ".join(f"{k} {v}" for k, v in sorted(phase3.items()))
        + f"""
  lost (annotation not matching content)      {lost}
  concurrent (overlapping reconciles of a     {overlaps}
    key across replicas)
""",
        flush=True,
    )
    per_replica_prom, depth, peak, p99, deliveries = prometheus_figures(demo_began)
    print(f"""  read back through Prometheus ({PROMETHEUS['url']}, every process scraped each second)
  ------------------------------------------  ----------------------------------------
  reconciles by replica                       """
          + ", ".join(f"{k} {v}" for k, v in sorted(per_replica_prom.items()))
          + """
    sum by (process) (max_over_time(controller_runtime_reconcile_total[1h]))
  deliveries by dispatcher                    """
          + ", ".join(f"{k} {v}" for k, v in sorted(deliveries.items()))
          + f"""
    sum by (process) (max_over_time(kube_dispatch_group_deliveries_total[1h]))
  reconcile time p99                          {p99 * 1000:.1f} ms
    histogram_quantile(0.99, sum by (le) (max_over_time(controller_runtime_reconcile_time_seconds_bucket[1h])))
  queue depth over the run, summed            peak {peak[1]:.0f} at +{peak[0]:.0f} s, {depth[-1][1] if depth else 0:.0f} at the end
    sum(workqueue_depth), 1 s steps           {sparkline(depth)}
""", flush=True)
    kdctl("status")
    kdctl("owner", "configmap", f"{OBJECTS_NS}/demo-00000")
    return 0 if lost == 0 and overlaps == 0 and total == OBJECTS else 1


def kdctl(*args):
    """Runs kdctl as an operator would (a token minted for the kdctl ServiceAccount, TLS
    against the control plane's CA) and prints what it says."""
    argv = [os.path.join(BIN_DIR, "kdctl"), "--kubeconfig", KUBECONFIG, "-n", LEASE_NS,
            # The local certificate names localhost, not the Service deploy/ gives dispatchers.
            "--tls-ca-file", TLS_ENV["KD_TLS_CA_FILE"], "--tls-server-name", "localhost",
            "--service-account",
            f"{OBJECTS_NS}/kdctl", *args]
    done = subprocess.run(argv, capture_output=True, text=True)
    print(f"  $ kdctl {' '.join(args)}   (exit {done.returncode})")
    for line in (done.stdout + done.stderr).rstrip().splitlines():
        print(f"    {line}")
    print(flush=True)


scaled_since = [0.0]


def takeover(killed_at, dispatcher=None, replica=None):
    """Seconds from the kill until the first reconcile after it of a key whose last reconcile
    before it the killed dispatcher delivered, or the killed replica ran."""
    runs = reconciles()
    # Each key's last reconcile before the kill: by the killed replica, or delivered by the
    # killed dispatcher.
    last = {}
    for r in sorted((r for r in runs if r[3] < killed_at), key=lambda r: r[3]):
        last[r[1]] = r
    keys = {
        key for key, r in last.items()
        if (dispatcher and dispatcher_names.get(r[2]) == dispatcher) or (replica and r[0] == replica)
    }
    starts = [r[3] for r in runs if r[3] >= killed_at and r[1] in keys]
    return min(starts) - killed_at if starts else float("nan")


def wait_after(write, label):
    """Makes the writes while showing progress, then waits until everything is reconciled;
    returns the seconds taken."""
    begin = time.monotonic()
    scaled_since[0] = datetime.now().timestamp()
    failed = []

    def run():
        try:
            write()
        except BaseException as e:  # kubectl failures end the demo: report them here
            failed.append(e)

    writer = threading.Thread(target=run)
    writer.start()
    wait_converged(label, scaled_since[0], writer, failed)
    writer.join()
    return time.monotonic() - begin


def wait_for_addresses():
    """Learns each live dispatcher's address from its Lease, to name them in the progress."""
    deadline = time.monotonic() + 60
    want = {n for n, p in processes.items() if n.startswith("dispatcher") and p.killed_at is None}
    while time.monotonic() < deadline:
        leases = json.loads(kubectl("-n", LEASE_NS, "get", "leases", "-o", "json"))["items"]
        for lease in leases:
            address = lease["metadata"].get("annotations", {}).get("kube-dispatch.dev/address")
            if address:
                dispatcher_names[address] = lease["metadata"]["name"]
        if want <= set(dispatcher_names.values()):
            return
        time.sleep(0.5)
    say(f"dispatchers never showed their Leases: {sorted(want - set(dispatcher_names.values()))}")
    raise SystemExit(1)


def cleanup():
    if KEEP:
        say(f"left running (KEEP=1); logs in {LOGS}. Stop with: kill "
            + " ".join(str(p.proc.pid) for p in processes.values() if p.proc.poll() is None))
        return
    for p in processes.values():
        p.stop()
    for p in processes.values():
        p.wait()
    kubectl("delete", "clusterrolebinding", f"{OBJECTS_NS}-kdctl", "--ignore-not-found",
            check=False)
    kubectl("delete", "namespace", OBJECTS_NS, "--wait=false", check=False)


if __name__ == "__main__":
    code = 1
    try:
        code = main()
    finally:
        cleanup()
    sys.exit(code)
