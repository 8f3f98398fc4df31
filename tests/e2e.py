"""`make e2e`, driven from tests/e2e.sh once the node is up and the image imported.

Installs the tier with its Helm chart (deploy/helm/kube-dispatch, read access to ConfigMaps
through watchedResources), as a user would; applies the example controllers of
deploy/examples/configmap-hasher and, beside it in a controller group of its own, the Go SDK's
example deploy/examples/configmap-hasher-go (with a host alias for the load balancer's Service,
as this node has no cluster DNS); makes the TLS Secrets with deploy/tls.sh; waits for the
dispatcher StatefulSet, the load balancer and both controller Deployments to be Ready; then,
with a writer changing the ConfigMaps of namespace e2e-objects all along:

1. baseline: every ConfigMap written once;
2. rolling update: `helm upgrade` of the release to another image tag (kube-dispatch:dev ->
   dev-2, the same image under a second name), so every dispatcher pod is replaced, highest
   ordinal first;
3. pod deleted: `kubectl delete pod kube-dispatch-dispatcher-1` (SIGTERM, drain, restart);
3b. SIGKILL: kube-dispatch-dispatcher-2's process killed through containerd (no drain, its
   Lease unreleased, reconciles in flight); the kubelet restarts its container;
3l. LB leader: the load balancer's leader pod deleted (it releases its Lease as it drains: the
   standby must lead at once), then the new leader killed with SIGKILL (the standby leads once
   the Lease expires, or the restarted process renews it first);
3c. Lease refused: kube-dispatch-dispatcher-1's Lease writes refused at admission until its
   alert, KubeDispatchLeaseRenewalsFailing, fires in a Prometheus on this machine, then allowed
   again until the alert resolves (tests/alert_e2e.py);
4. eviction: dispatcher-0 evicted through the Eviction API, then dispatcher-2 at once: the
   PodDisruptionBudget (maxUnavailable 1) must refuse the second;
5. the (Rust) controller Deployment scaled 2 -> 4, then 4 -> 1.

Beside them, both SDKs' ported controllers (deploy/examples/ported-go and ported-rust, applied
as kustomize builds them) run their own scenario, each in a namespace of its own (e2e-ported,
e2e-ported-rust; tests/ported_e2e.py): their objects created before the baseline, changed as
the rolling update begins, checked after the last phase, then deleted after one controller pod
is deleted. Not in `make test-skew` (the previous release's images do not hold them).

E2E_SHORT=1 (what `make test` runs): 1, 2, 3b, 3l, 3c, and the controller scaled 2 -> 1.

E2E_FROM_ROOT=<tree> E2E_FROM_VERSION=<version> (what `make test-skew` runs, tests/skew.sh):
the tier is installed from that release's tree (its chart, its tls.sh) with its images
(kube-dispatch:<version>, kube-dispatch-go-hasher:<version>), and so are both example
controllers, built with that release's SDKs; the phases are the baseline, the tier upgraded to
this tree with `helm upgrade --reset-then-reuse-values` (image tag dev) while the previous
release's controllers keep running, the controller scaled 2 -> 1 on the upgraded tier, and the
tier downgraded to the previous release again with `helm rollback` (its chart, values and
images) under the same controllers.

Each phase ends when every ConfigMap carries the hash of its content again in both
controllers' annotations, and prints: writes, lost (ConfigMaps whose annotations do not match
their content once the phase has settled), concurrent (pairs of reconciles of one ConfigMap
that overlapped in time on different replicas of one controller, from every controller pod's
JSON log), the longest write-to-reconcile delay of each controller (from a write until a
watch sees its annotation of that content), the longest a ConfigMap waited (from its first
write not yet reconciled until a reconcile covered its latest: a write superseded before its
reconcile is not timed, so this is what shows a key held longer than the writer's round), and
per dispatcher pod replaced: how
long it drained (SIGTERM to gone, and its exit code) and how long the new pod took to be Ready
(its handover). Exits non-zero unless lost and concurrent are 0 in every phase, every phase's
writes were reconciled at least once each in each controller's logs read, the
PodDisruptionBudget refused the second eviction, and `kdctl status`, run with the node's
kubeconfig alone at the end, answers healthy.
"""

import json
from datetime import datetime
import math
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reconciles import (  # noqa: E402
    annotated, concurrent, content_hash, go_annotated, go_content_hash, go_spans, spans,
)
import alert_e2e  # noqa: E402
import ported_e2e  # noqa: E402

KUBECONFIG, KUBECTL, NODE_DIR, ROOT = sys.argv[1:5]
OBJECTS = int(os.environ.get("E2E_OBJECTS", "200"))
# Writes per second while a phase runs.
RATE = float(os.environ.get("E2E_WRITE_RATE", "20"))
SHORT = bool(os.environ.get("E2E_SHORT"))
# Seconds the writer goes on after each phase's action is done.
TAIL = float(os.environ.get("E2E_TAIL", "10"))
OBJECTS_NS = "e2e-objects"
TIER_NS = "kube-dispatch"
# The chart the tier is installed with, and helm (tests/tools.sh helm).
CHART = os.path.join(ROOT, "deploy", "helm", "kube-dispatch")
HELM = os.environ["KD_HELM"]
CONTROLLER_NS = "configmap-hasher"
# The Go SDK's example controller, a group of its own on the same tier.
GO_CONTROLLER_NS = "configmap-hasher-go"
LOGS = os.path.join(NODE_DIR, "logs", "e2e")
SETTLE_TIMEOUT = 300
# Skew: the previous release's tree and version to install first (tests/skew.sh).
FROM_ROOT = os.environ.get("E2E_FROM_ROOT")
FROM_VERSION = os.environ.get("E2E_FROM_VERSION")
INSTALL_ROOT = FROM_ROOT or ROOT
INSTALL_TAG = FROM_VERSION or "dev"
T0 = time.monotonic()
# containerd's ctr on the node (tests/node/node.sh env: KD_CTR), for the SIGKILL.
CTR = os.environ.get("KD_CTR", "ctr").split()


def say(message):
    print(f"e2e: {time.monotonic() - T0:6.1f}s {message}", flush=True)


def kubectl(*args, stdin=None, check=True):
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", KUBECONFIG, *args], input=stdin, capture_output=True, text=True
    )
    if check and done.returncode != 0:
        raise SystemExit(f"e2e: kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


class Api:
    """The API server, called directly for the writes and the evictions (a kubectl process per
    write would cost more CPU than the tier under test)."""

    def __init__(self):
        config = json.loads(kubectl("config", "view", "--raw", "-o", "json"))
        cluster = config["clusters"][0]["cluster"]
        self.server = cluster["server"]
        self.token = config["users"][0]["user"]["token"]
        self.tls = ssl.create_default_context(cafile=cluster["certificate-authority"])

    def call(self, method, path, body=None, content_type="application/json"):
        request = urllib.request.Request(
            self.server + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type},
        )
        try:
            with urllib.request.urlopen(request, context=self.tls, timeout=30) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


API = None
# Every kubectl that runs in the background (watches, log followers): stopped on the way out.
# Watches start theirs again from their own threads, so the list is changed under its lock, and
# none is started once the way out has begun (the exit would wait on it for good).
BACKGROUND = []
BACKGROUND_LOCK = threading.Lock()
EXITING = threading.Event()


class Exiting(Exception):
    """No background process is started on the way out."""


def background(argv, **kwargs):
    with BACKGROUND_LOCK:
        if EXITING.is_set():
            raise Exiting()
        proc = subprocess.Popen(argv, **kwargs)
        BACKGROUND.append(proc)
    return proc


def forget_background(proc):
    """A background process that has ended, and that nobody needs to stop any more."""
    with BACKGROUND_LOCK:
        BACKGROUND.remove(proc)


def stop_background():
    """Stops every background process and waits for each; none starts after this."""
    with BACKGROUND_LOCK:
        EXITING.set()
        procs = list(BACKGROUND)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait()


class Watch(threading.Thread):
    """`kubectl get -w` of one resource, calling `on_event(type, object, seconds)` for each
    event. kubectl ends when the API server closes the watch (its timeout, a restart): the watch
    is started again, its list showing every object once more, so that later phases still see
    reconciles (a watch that had ended made every later phase report no latency at all)."""

    def __init__(self, on_event, *args):
        super().__init__(daemon=True)
        self.on_event = on_event
        self.argv = [KUBECTL, "--kubeconfig", KUBECONFIG, "get", *args, "--watch",
                     "--output-watch-events", "-o", "json"]
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.restarts = 0
        self.proc = self.start_kubectl()

    def start_kubectl(self):
        return background(self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)

    def run(self):
        while True:
            self.read(self.proc)
            # A second apart, so a watch refused at once (the API server down) does not spin;
            # the kubectl that ended leaves the list of those to stop on the way out.
            if self.stopped.wait(1):
                return
            with self.lock:
                if self.stopped.is_set():
                    return
                forget_background(self.proc)
                try:
                    self.proc = self.start_kubectl()
                except Exiting:
                    return
                self.restarts += 1
                say(f"the watch `{' '.join(self.argv[3:])}` ended: started again "
                    f"({self.restarts} so far)")

    def read(self, proc):
        decoder, buffer = json.JSONDecoder(), ""
        for line in proc.stdout:
            # An event per line (kubectl's -o json while watching), or one spread over several.
            buffer += line
            try:
                event, _ = decoder.raw_decode(buffer.strip())
            except ValueError:
                continue
            buffer = ""
            self.on_event(event["type"], event["object"], time.time())
        proc.wait()

    def stop(self):
        with self.lock:
            self.stopped.set()
            self.proc.terminate()


class Sent:
    """One write: the hash of what it wrote, when it was sent, and once the API server answered,
    when and at which resourceVersion."""

    __slots__ = ("digest", "at", "answered", "version")

    def __init__(self, digest, at):
        self.digest, self.at, self.answered, self.version = digest, at, None, ""


class Objects:
    """The ConfigMaps the writer changes, and the delay from each write until the watch sees
    its content's hash in one controller's annotation (`current` and `digest`: that
    controller's check and hash). A write superseded before it is reconciled is not timed (the
    writer comes back to each ConfigMap every OBJECTS / RATE seconds), so each ConfigMap's wait
    is kept too: from its first write not yet reconciled until a reconcile covers its latest,
    which shows a key held for longer than the writer's round. A write is recorded before it is
    sent: the reconcile it causes may be seen before the writer has read the API server's
    answer (a write recorded only then stayed uncovered, and the ConfigMap seemed to wait a whole
    round of the writer)."""

    def __init__(self, current=annotated, digest=content_hash):
        self.current, self.digest = current, digest
        self.lock = threading.Lock()
        # name -> its latest write (Sent), until the watch sees it reconciled
        self.pending = {}
        # (seconds from sending the write to the annotation seen, name, the write)
        self.delays = []
        # (seconds a ConfigMap waited from its first unreconciled write, name)
        self.waits = []
        # name -> [Sent] of the writes no reconcile has covered yet
        self.unreconciled = {}
        self.writes = 0
        self.generation = 0

    def sending(self, name, data, at):
        """A write of `data` to `name`, sent at `at`; the caller fills in the answer."""
        sent = Sent(self.digest(data), at)
        with self.lock:
            self.pending[name] = sent
            self.unreconciled.setdefault(name, []).append(sent)
            self.writes += 1
        return sent

    def on_event(self, kind, cm, at):
        if kind not in ("ADDED", "MODIFIED") or not self.current(cm):
            return
        name = cm["metadata"]["name"]
        with self.lock:
            digest = self.digest(cm.get("data") or {})
            want = self.pending.get(name)
            if want and want.digest == digest:
                del self.pending[name]
                self.delays.append((at - want.at, name, want))
            # A reconcile of a write covers it and every write before it; the ConfigMap waited
            # from its first write not covered until one covers its latest.
            writes = self.unreconciled.get(name, [])
            covered = max((i for i, w in enumerate(writes) if w.digest == digest), default=None)
            if covered is not None:
                if covered == len(writes) - 1:
                    self.waits.append((at - writes[0].at, name))
                del writes[:covered + 1]

    def take(self):
        """The delays of the writes reconciled since the last take (seconds, name, seconds the
        API server took to answer, resourceVersion), their count, and the longest a ConfigMap
        waited ((0, "-") with none)."""
        with self.lock:
            delays, writes, waits = self.delays, self.writes, self.waits
            self.delays, self.writes, self.waits = [], 0, []
        delays = [(d, name, (w.answered or w.at) - w.at, w.version) for d, name, w in delays]
        return delays, writes, max(waits, default=(0.0, "-"))


OBJECTS_SEEN = Objects()
GO_SEEN = Objects(go_annotated, go_content_hash)


def write(name, generation):
    data = {"index": name, "generation": str(generation)}
    at = time.time()
    sent = [seen.sending(name, data, at) for seen in (OBJECTS_SEEN, GO_SEEN)]
    status, body = API.call(
        "PATCH", f"/api/v1/namespaces/{OBJECTS_NS}/configmaps/{name}",
        {"data": data}, content_type="application/merge-patch+json",
    )
    if status == 404:
        status, body = API.call(
            "POST", f"/api/v1/namespaces/{OBJECTS_NS}/configmaps",
            {"metadata": {"name": name, "namespace": OBJECTS_NS}, "data": data},
        )
    answered = time.time()
    if status >= 300:
        raise SystemExit(f"e2e: writing {name} failed: {status} {body.get('message')}")
    version = (body.get("metadata") or {}).get("resourceVersion", "")
    for w in sent:
        w.answered, w.version = answered, version


class Writer(threading.Thread):
    """Changes the ConfigMaps one after another at RATE writes per second until stopped."""

    def __init__(self):
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.failed = None

    def run(self):
        try:
            i = 0
            while not self.done.is_set():
                if i % OBJECTS == 0:
                    OBJECTS_SEEN.generation += 1
                write(f"cm-{i % OBJECTS:04d}", OBJECTS_SEEN.generation)
                i += 1
                self.done.wait(1 / RATE)
        except BaseException as e:  # reported by the phase
            self.failed = e

    def stop(self):
        self.done.set()
        self.join()
        if self.failed:
            raise SystemExit(f"e2e: the writer failed: {self.failed}")


class Pods:
    """The dispatcher pods' lives from a watch: when each was told to stop (deletionTimestamp),
    when it was gone and with what exit code, and when each pod became Ready."""

    def __init__(self):
        self.lock = threading.Lock()
        self.terminating = {}  # uid -> (name, when the deletion was seen)
        self.drains = []  # (name, seconds from SIGTERM to gone, exit code)
        self.ready = {}  # uid -> (name, when Ready, when created)
        self.stopped_at = {}  # name -> when its last pod was told to stop

    def on_event(self, kind, pod, at):
        meta = pod["metadata"]
        uid, name = meta["uid"], meta["name"]
        with self.lock:
            if meta.get("deletionTimestamp") and uid not in self.terminating:
                self.terminating[uid] = (name, at)
                self.stopped_at[name] = at
            if kind == "DELETED":
                _, since = self.terminating.get(uid, (name, at))
                codes = [
                    (s.get("state", {}).get("terminated")
                     or s.get("lastState", {}).get("terminated") or {}).get("exitCode")
                    for s in pod.get("status", {}).get("containerStatuses", [])
                ]
                self.drains.append((name, at - since, codes[0] if codes else None))
                return
            conditions = pod.get("status", {}).get("conditions", [])
            is_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            if is_ready and uid not in self.ready and not meta.get("deletionTimestamp"):
                self.ready[uid] = (name, at, self.stopped_at.get(name))

    def take(self):
        with self.lock:
            drains, self.drains = self.drains, []
            ready = [v for v in self.ready.values() if v[2] is not None]
            for uid in [u for u, v in self.ready.items() if v[2] is not None]:
                self.ready[uid] = (self.ready[uid][0], self.ready[uid][1], None)
            return drains, ready


PODS = Pods()


class ControllerLogs:
    """Follows the log of every pod of `namespace` into LOGS/<pod>-<uid>.log (`kubectl logs
    -f`) once a watch of its pods shows its container started, so reconciles of pods scaled
    away still count, and the logs of a StatefulSet's pods replaced under the same name are
    all kept; a container restarted in its pod (killed, say) is followed again, into
    LOGS/<pod>-<uid>-<restarts>.log. `read` takes the reconciles from a log."""

    def __init__(self, namespace, read=None):
        self.namespace, self.read = namespace, read
        self.lock = threading.Lock()
        self.followed = {}  # (uid, restarts) -> (pod name, log file)

    def on_event(self, kind, pod, at):
        name, uid = pod["metadata"]["name"], pod["metadata"].get("uid", "")
        statuses = pod.get("status", {}).get("containerStatuses", [])
        started = any("running" in s.get("state", {}) or "terminated" in s.get("state", {})
                      for s in statuses)
        running = any("running" in s.get("state", {}) for s in statuses)
        restarts = sum(s.get("restartCount", 0) for s in statuses)
        suffix = f"-{restarts}" if restarts else ""
        path = os.path.join(LOGS, f"{name}-{uid[:8]}{suffix}.log")
        with self.lock:
            # A restarted container is followed once it runs (the log of the one before has
            # ended with it).
            if (kind == "DELETED" or not started or (restarts and not running)
                    or (uid, restarts) in self.followed):
                return
            self.followed[(uid, restarts)] = (name, path)
        with open(path, "w") as out:
            background(
                [KUBECTL, "--kubeconfig", KUBECONFIG, "-n", self.namespace, "logs", "-f",
                 "--all-containers", "--timestamps", f"pod/{name}"] if self.read is None else
                [KUBECTL, "--kubeconfig", KUBECONFIG, "-n", self.namespace, "logs", "-f", name],
                stdout=out, stderr=subprocess.DEVNULL,
            )

    def runs(self):
        with self.lock:
            followed = sorted(self.followed.values())
        found = []
        for name, path in followed:
            with open(path) as f:
                for key, _, begun, end in self.read(f):
                    found.append((name, key, begun, end))
        return found


LOG_FOLLOWER = ControllerLogs(CONTROLLER_NS, spans)
GO_LOG_FOLLOWER = ControllerLogs(GO_CONTROLLER_NS, go_spans)
# The ported Go and Rust controllers (tests/ported_e2e.py), but not in `make test-skew`: a
# previous release's images do not hold them.
PORTED = [] if FROM_ROOT else [
    ported_e2e.Ported(kubectl, say, ported_e2e.GO,
                      ControllerLogs(ported_e2e.GO["controller_ns"], go_spans)),
    ported_e2e.Ported(kubectl, say, ported_e2e.RUST,
                      ControllerLogs(ported_e2e.RUST["controller_ns"], spans)),
]
# An alert fired by a fault and resolved after it (tests/alert_e2e.py); not in `make test-skew`.
ALERTS = None if FROM_ROOT else alert_e2e.AlertFault(kubectl, say, ROOT, LOGS, TIER_NS, background)
# The tier's own pods, kept for reading after the run (a rolling update deletes them).
TIER_LOGS = ControllerLogs(TIER_NS)


def unsettled():
    items = json.loads(kubectl("-n", OBJECTS_NS, "get", "configmaps", "-o", "json"))["items"]
    mine = [i for i in items if i["metadata"]["name"].startswith("cm-")]
    # Settled: both controllers' annotations hold the hash of the current content.
    return sum(1 for i in mine if not (annotated(i) and go_annotated(i))) + (OBJECTS - len(mine))


def longest(worst):
    """A phase's longest write to reconcile, `(seconds, name)`: "unmeasured" when the watch saw
    no write reconciled (the name is "-"), which must not read as 0 ms."""
    seconds, name = worst
    return "unmeasured" if name == "-" else f"{seconds * 1000:.0f} ms ({name})"


def settle():
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        left = unsettled()
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(1)


def wait_rollouts():
    rollouts = [("statefulset", "kube-dispatch-dispatcher", TIER_NS),
                ("deployment", "kube-dispatch-loadbalancer", TIER_NS),
                ("deployment", "configmap-hasher", CONTROLLER_NS),
                ("deployment", "configmap-hasher-go", GO_CONTROLLER_NS)]
    rollouts += [("deployment", ported_e2e.DEPLOYMENT, p.controller_ns) for p in PORTED]
    for kind, name, ns in rollouts:
        kubectl("-n", ns, "rollout", "status", f"{kind}/{name}", "--timeout", "300s")


def wait_pod_replaced(name, old_uid, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = json.loads(kubectl("-n", TIER_NS, "get", "pod", name, "-o", "json", check=False)
                         or "{}")
        if pod and pod["metadata"]["uid"] != old_uid:
            conditions = pod.get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return
        time.sleep(0.5)
    raise SystemExit(f"e2e: {name} did not come back Ready within {timeout} s")


def uid_of(name):
    return kubectl("-n", TIER_NS, "get", "pod", name, "-o", "jsonpath={.metadata.uid}")


results = []


def phase(label, action, writing=True):
    """Runs `action` while the writer changes the ConfigMaps (unless `writing` is False: the
    action writes them itself), waits until they settle, and reports."""
    say(f"{label}: starting")
    begin_wall = time.time()
    OBJECTS_SEEN.take()
    GO_SEEN.take()
    PODS.take()
    writer = Writer()
    if writing:
        writer.start()
    started = time.monotonic()
    note = action() or ""
    took = time.monotonic() - started
    if writing:
        # Writes go on a while after the action is done, through whatever it set moving.
        time.sleep(TAIL)
        writer.stop()
    left = settle()
    delays, writes, waited = OBJECTS_SEEN.take()
    go_delays, _, go_waited = GO_SEEN.take()
    drains, ready = PODS.take()
    runs = [r for r in LOG_FOLLOWER.runs() if r[3] is None or r[3] >= begin_wall]
    go_runs = [r for r in GO_LOG_FOLLOWER.runs() if r[3] is None or r[3] >= begin_wall]
    # Each group's reconciles of a key must not overlap; the two groups' may.
    overlaps = concurrent(runs) + concurrent(go_runs)
    worst = max(delays, default=(0.0, "-"))[:2]
    go_worst = max(go_delays, default=(0.0, "-"))[:2]
    p99, go_p99 = percentile(delays, 0.99), percentile(go_delays, 0.99)
    result = {
        "phase": label, "seconds": took, "writes": writes, "lost": left,
        "concurrent": overlaps, "reconciles": len(runs), "go_reconciles": len(go_runs),
        "worst": worst, "go_worst": go_worst, "p99": p99, "go_p99": go_p99,
        "waited": waited, "go_waited": go_waited,
        "drains": sorted(drains), "handovers": sorted((n, r - s) for n, r, s in ready),
        "note": note,
    }
    results.append(result)
    say(f"{label}: {took:.1f} s, {writes} writes, {len(runs)} reconciles (Go: {len(go_runs)}), "
        f"lost {left}, concurrent {overlaps}, longest write to reconcile "
        f"{longest(worst)}, Go {longest(go_worst)}; "
        f"p99 {p99 * 1000:.0f} ms, Go {go_p99 * 1000:.0f} ms; longest a ConfigMap waited "
        f"{waited[0] * 1000:.0f} ms ({waited[1]}), Go {go_waited[0] * 1000:.0f} ms ({go_waited[1]})")
    # The slowest writes, with the API server's own share: a write answered late was slow
    # before the tier saw it. Every write is in LOGS/writes.tsv.
    for controller, ds in (("Rust", delays), ("Go", go_delays)):
        slowest = ", ".join(f"{n} rv {rv} {d * 1000:.0f} ms (API {api * 1000:.0f} ms)"
                            for d, n, api, rv in sorted(ds, reverse=True)[:3])
        say(f"  slowest writes, {controller}: {slowest or '-'}")
    with open(os.path.join(LOGS, "writes.tsv"), "a") as out:
        for controller, ds in (("rust", delays), ("go", go_delays)):
            for d, n, api, rv in ds:
                out.write(f"{label}\t{controller}\t{n}\t{rv}\t{api * 1000:.1f}\t{d * 1000:.1f}\n")
    for name, seconds, code in result["drains"]:
        say(f"  {name} drained in {seconds:.1f} s (exit code {code})")
    for name, seconds in result["handovers"]:
        say(f"  {name} back and Ready {seconds:.1f} s after it was told to stop")
    if note:
        say(f"  {note}")


def percentile(delays, q):
    """The `q` quantile of the delays (seconds), nearest rank; 0 with none."""
    ordered = sorted(d[0] for d in delays)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def baseline():
    for i in range(OBJECTS):
        write(f"cm-{i:04d}", 0)


def helm(*args):
    done = subprocess.run([HELM, "--kubeconfig", KUBECONFIG, *args], capture_output=True, text=True,
                          env={**os.environ, "HELM_CACHE_HOME": os.path.join(LOGS, "helm-cache"),
                               "HELM_CONFIG_HOME": os.path.join(LOGS, "helm-config"),
                               "HELM_DATA_HOME": os.path.join(LOGS, "helm-data")})
    if done.returncode != 0:
        raise SystemExit(f"e2e: helm {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def apply_controllers():
    """The example controllers' manifests as their overlays give them, with what this node
    lacks: no cluster DNS, so each pod resolves the load balancer's Service name through a host
    alias onto the Service's ClusterIP (kube-proxy routes it); and the JSON logs (the Go one at
    debug level) from which every reconcile's start and end are read."""
    import yaml
    address = kubectl("-n", TIER_NS, "get", "service", "kube-dispatch-loadbalancer",
                      "-o", "jsonpath={.spec.clusterIP}")
    alias = [{"ip": address, "hostnames": ["kube-dispatch-loadbalancer.kube-dispatch.svc"]}]
    examples = os.path.join(INSTALL_ROOT, "deploy", "examples")
    controllers = [
        ("configmap-hasher", f"kube-dispatch:{INSTALL_TAG}",
         [{"name": "KD_LOG_JSON", "value": "1"}], []),
        ("configmap-hasher-go", f"kube-dispatch-go-hasher:{INSTALL_TAG}", [],
         # Level 2, not debug: controller-runtime samples its production logger (past 100 lines
         # of one message a second) unless the level is 2 or more, and every line counts here.
         ["--zap-log-level=2", "--zap-time-encoding=epoch"]),
    ]
    documents = []
    for example, image, env, args in controllers:
        with open(os.path.join(examples, example, "controller.yaml")) as f:
            for o in yaml.safe_load_all(f):
                if o and o["kind"] == "Deployment":
                    pod = o["spec"]["template"]["spec"]
                    pod["hostAliases"] = alias
                    container = pod["containers"][0]
                    container["image"] = image
                    container.setdefault("env", []).extend(env)
                    container.setdefault("args", []).extend(args)
                if o:
                    documents.append(o)
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))
    for p in PORTED:
        p.apply(ROOT, alias, INSTALL_TAG)


def rolling_update():
    """`helm upgrade` to a new image tag (the same image under a second name): every
    dispatcher pod is replaced, one at a time, highest ordinal first. The ported controllers'
    objects are changed as it begins."""
    for p in PORTED:
        p.change()
    helm("upgrade", "kube-dispatch", CHART, "--namespace", TIER_NS, "--reuse-values",
         "--set", "image.tag=dev-2")
    kubectl("-n", TIER_NS, "rollout", "status", "statefulset/kube-dispatch-dispatcher",
            "--timeout", "600s")


def upgrade():
    """`helm upgrade` from the previous release's chart and images to this tree's (image tag
    dev), keeping the values the release was installed with and taking the new chart's
    defaults for the rest: every dispatcher and load-balancer pod is replaced while the
    previous release's controllers keep running."""
    helm("upgrade", "kube-dispatch", CHART, "--namespace", TIER_NS, "--reset-then-reuse-values",
         "--set", "image.tag=dev")
    kubectl("-n", TIER_NS, "rollout", "status", "statefulset/kube-dispatch-dispatcher",
            "--timeout", "600s")
    kubectl("-n", TIER_NS, "rollout", "status", "deployment/kube-dispatch-loadbalancer",
            "--timeout", "600s")
    return (f"tier images now: {images(TIER_NS)}; the controllers' still: "
            f"{images(CONTROLLER_NS)}, {images(GO_CONTROLLER_NS)}")


def images(namespace):
    """The images the pods of `namespace` run, sorted, once each."""
    said = kubectl("-n", namespace, "get", "pods", "-o",
                   "jsonpath={range .items[*]}{.spec.containers[0].image}{'\\n'}{end}")
    return ", ".join(sorted(set(said.split())))


def downgrade():
    """`helm rollback` to the release installed first: the previous release's chart, values and
    images replace every dispatcher and load-balancer pod of this tree, one at a time, while
    the controllers keep running (a rolling update with both versions on the ring)."""
    helm("rollback", "kube-dispatch", "1", "--namespace", TIER_NS)
    kubectl("-n", TIER_NS, "rollout", "status", "statefulset/kube-dispatch-dispatcher",
            "--timeout", "600s")
    kubectl("-n", TIER_NS, "rollout", "status", "deployment/kube-dispatch-loadbalancer",
            "--timeout", "600s")
    return f"tier images now: {images(TIER_NS)}"


def delete_pod():
    old = uid_of("kube-dispatch-dispatcher-1")
    kubectl("-n", TIER_NS, "delete", "pod", "kube-dispatch-dispatcher-1", "--wait=false")
    wait_pod_replaced("kube-dispatch-dispatcher-1", old)


def container_status(name):
    pod = json.loads(kubectl("-n", TIER_NS, "get", "pod", name, "-o", "json"))
    return (pod.get("status", {}).get("containerStatuses") or [{}])[0]


def sigkill(name):
    """SIGKILL to pod `name`'s process, through containerd, as the OOM killer or a crash would
    end it; returns when, and its container's status before."""
    before = container_status(name)
    killed = time.monotonic()
    kill = subprocess.run([*CTR, "tasks", "kill", "--signal", "SIGKILL",
                           before["containerID"].split("://", 1)[1]],
                          capture_output=True, text=True)
    if kill.returncode != 0:
        raise SystemExit(f"e2e: ctr could not kill {name}'s container: {kill.stderr.strip()}")
    return killed, before


def restarted(name, killed, before, timeout=300):
    """Waits until pod `name`'s container, killed at `killed`, runs again and is Ready (it must
    have ended with SIGKILL's 137); returns the seconds since the kill."""
    deadline = killed + timeout
    while time.monotonic() < deadline:
        now = container_status(name)
        if now.get("restartCount", 0) > before["restartCount"] and now.get("ready"):
            exit_code = now.get("lastState", {}).get("terminated", {}).get("exitCode")
            if exit_code != 137:
                raise SystemExit(f"e2e: {name}'s container ended with {exit_code}, not SIGKILL's 137")
            return time.monotonic() - killed
        time.sleep(0.5)
    raise SystemExit(f"e2e: {name} was not restarted and Ready within {timeout} s of its SIGKILL")


def kill_dispatcher():
    """SIGKILL to kube-dispatch-dispatcher-2's process: no drain, its Lease left unreleased, its
    sessions cut with reconciles in flight. The kubelet restarts the container in the same pod;
    the new process finds its Lease unreleased and hands nothing out until the reconciles its
    predecessor started are over."""
    name = "kube-dispatch-dispatcher-2"
    killed, before = sigkill(name)
    seconds = restarted(name, killed, before)
    return (f"{name} killed with SIGKILL (exit code 137); its container restarted and Ready "
            f"{seconds:.1f} s later")


LB_LEASE = "kube-dispatch-loadbalancer"


def lb_lease():
    """The load balancer leader Lease's holder (the leader's advertised address), renew time
    and duration."""
    status, lease = API.call(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{TIER_NS}/leases/{LB_LEASE}")
    if status != 200:
        return None  # not known now (an error is no release)
    spec = lease.get("spec", {})
    return (spec.get("holderIdentity") or "", spec.get("renewTime"),
            spec.get("leaseDurationSeconds") or 15)


def lb_pod(holder):
    """The load balancer pod whose address `holder` is (its pod IP and gRPC port)."""
    pods = json.loads(kubectl("-n", TIER_NS, "get", "pods", "-o", "json"))["items"]
    ip = holder.rsplit(":", 1)[0].strip("[]")
    return next((p["metadata"]["name"] for p in pods
                 if p["metadata"]["name"].startswith("kube-dispatch-loadbalancer-")
                 and p.get("status", {}).get("podIP") == ip), holder)


def lb_leader():
    """The load balancer leader Lease as lb_lease reads it, retried past API errors."""
    for _ in range(100):
        lease = lb_lease()
        if lease is not None:
            return lease
        time.sleep(0.1)
    raise SystemExit("e2e: the load balancer's leader Lease cannot be read")


def renewed_after(renew, wall):
    """Whether the Lease renew time `renew` (RFC 3339) is later than `wall` (seconds since the
    epoch; the load balancer runs on this machine, so one clock)."""
    return bool(renew) and datetime.fromisoformat(renew.replace("Z", "+00:00")).timestamp() > wall


def leads_again(old, since, timeout, killed_at=None):
    """Waits until a load balancer leads again after leader `old` (a holder) was stopped at
    `since`: another holds the Lease, or (`killed_at`: its container, killed then, restarts
    under the same address) a new process of `old` renewed it after the kill. Returns the new
    holder, the seconds since `since`, and the seconds since the Lease was seen released (None
    if it never was: released and taken between two looks, 20 ms apart)."""
    released = None
    while time.monotonic() - since < timeout:
        lease = lb_lease()
        if lease is None:
            time.sleep(0.02)
            continue
        holder, renew, _ = lease
        now = time.monotonic()
        if not holder and released is None:
            released = now
        if holder and (holder != old or (killed_at and renewed_after(renew, killed_at))):
            return holder, now - since, None if released is None else now - released
        time.sleep(0.02)
    raise SystemExit(f"e2e: no load balancer led within {timeout} s after {lb_pod(old)} stopped")


def loadbalancer_leader():
    """The load balancer's leader stopped cleanly (its pod deleted: after its preStop sleep it
    releases its Lease as it drains), then the new leader killed with SIGKILL (nothing
    released). The standby must lead at once after a release, and within the Lease's duration
    after a kill, while the replicas go on reconciling (the phase's writes)."""
    old, _, duration = lb_leader()
    if not old:
        raise SystemExit("e2e: no load balancer holds the leader Lease")
    old_pod = lb_pod(old)
    stopped = time.monotonic()
    kubectl("-n", TIER_NS, "delete", "pod", old_pod, "--wait=false")
    new, clean, leaderless = leads_again(old, stopped, 60)
    new_pod = lb_pod(new)
    # A standby that waited for the Lease to expire after a release (or a leader that never
    # released it) would take a duration, past the 3 s of the pod's preStop sleep.
    if (leaderless is not None and leaderless > duration / 2) or clean > 3 + duration / 2:
        raise SystemExit(f"e2e: the standby led {clean:.1f} s after {old_pod} was deleted, as if "
                         f"it waited for the Lease ({duration} s) to expire")
    kubectl("-n", TIER_NS, "rollout", "status", "deployment/kube-dispatch-loadbalancer",
            "--timeout", "300s")
    killed_at = time.time()
    killed, before = sigkill(new_pod)
    newer, after_kill, _ = leads_again(new, killed, duration + 60, killed_at=killed_at)
    back = restarted(new_pod, killed, before)
    if after_kill > duration + 2:
        raise SystemExit(f"e2e: no load balancer led within the Lease ({duration} s) after "
                         f"{new_pod} was killed: {after_kill:.1f} s")
    gap = ("within one look (20 ms)" if leaderless is None
           else f"{leaderless * 1000:.0f} ms after the release was seen")
    return (f"leader {old_pod} stopped cleanly: {new_pod} led {gap}, {clean:.1f} s after the "
            f"pod's deletion (its preStop sleep keeps it leading 3 s); {new_pod} killed with "
            f"SIGKILL: {lb_pod(newer)} led {after_kill:.1f} s later (Lease {duration} s), "
            f"{new_pod} Ready again {back:.1f} s after the kill")


def evict(name):
    return API.call("POST", f"/api/v1/namespaces/{TIER_NS}/pods/{name}/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": TIER_NS},
    })


PDB_REFUSED = []


def evictions():
    old = uid_of("kube-dispatch-dispatcher-0")
    status, body = evict("kube-dispatch-dispatcher-0")
    if status >= 300:
        raise SystemExit(f"e2e: evicting dispatcher-0 failed: {status} {body.get('message')}")
    status, body = evict("kube-dispatch-dispatcher-2")
    refused = status == 429
    PDB_REFUSED.append(refused)
    wait_pod_replaced("kube-dispatch-dispatcher-0", old)
    return (f"second eviction (dispatcher-2 while dispatcher-0 was down): {status} "
            f"{body.get('message', '')}")


def scale(replicas):
    """Scales the controller and waits until exactly `replicas` pods exist, all Ready (the
    pods scaled away have finished their reconciles and exited)."""

    def run():
        kubectl("-n", CONTROLLER_NS, "scale", "deployment/configmap-hasher",
                f"--replicas={replicas}")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            pods = json.loads(kubectl("-n", CONTROLLER_NS, "get", "pods", "-o", "json"))["items"]
            ready = [p for p in pods if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", []))]
            if len(pods) == replicas and len(ready) == replicas:
                return f"{replicas} controller pods, all Ready"
            time.sleep(0.5)
        raise SystemExit(f"e2e: the controller did not settle at {replicas} pods within 300 s")
    return run


def kdctl_status():
    """`kdctl status` as an operator runs it with a kubeconfig and nothing else: the CA bundle
    and the name on the dispatchers' certificates come from the cluster. Its exit status."""
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    argv = [os.path.join(target, "debug", "kdctl"), "--kubeconfig", KUBECONFIG, "status"]
    # A handover may still be settling after the last phase (exit 3): ask again for a while.
    deadline = time.monotonic() + 60
    while True:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            code, said = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            code, said = -1, "kdctl did not answer within 60 s"
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(2)
    say(f"kdctl status (with only a kubeconfig): exit {code}")
    for line in said.rstrip().splitlines():
        print(f"    {line}", flush=True)
    return code


def main():
    global API
    os.makedirs(LOGS, exist_ok=True)
    if os.path.exists(os.path.join(LOGS, "writes.tsv")):
        os.remove(os.path.join(LOGS, "writes.tsv"))
    if FROM_ROOT:
        say(f"installing release {FROM_VERSION} of the tier with its Helm chart (from {FROM_ROOT})")
    else:
        say("installing the tier with its Helm chart (deploy/helm/kube-dispatch)")
    helm("install", "kube-dispatch", os.path.join(INSTALL_ROOT, "deploy", "helm", "kube-dispatch"),
         "--namespace", TIER_NS, "--create-namespace",
         "--set", f"image.tag={INSTALL_TAG}",
         "--set-json", 'watchedResources=[{"apiGroups": [""], "resources": ["configmaps"]}]')
    say("applying the example controllers (deploy/examples/configmap-hasher and "
        "configmap-hasher-go) for this node")
    apply_controllers()
    subprocess.run(
        [os.path.join(INSTALL_ROOT, "deploy", "tls.sh"), "--dir", os.path.join(NODE_DIR, "e2e-pki"),
         "--controller-namespace", CONTROLLER_NS, "--controller-namespace", GO_CONTROLLER_NS,
         *[a for p in PORTED for a in ("--controller-namespace", p.controller_ns)]],
        env={**os.environ, "KUBECTL": KUBECTL, "KUBECONFIG": KUBECONFIG}, check=True,
        stdout=subprocess.DEVNULL,
    )
    kubectl("create", "namespace", OBJECTS_NS, check=False)
    API = Api()
    pods = Watch(lambda *event: (PODS.on_event(*event), TIER_LOGS.on_event(*event)),
                 "pods", "-n", TIER_NS)
    objects = Watch(
        lambda *event: (OBJECTS_SEEN.on_event(*event), GO_SEEN.on_event(*event)),
        "configmaps", "-n", OBJECTS_NS,
    )
    pods.start()
    objects.start()
    wait_rollouts()
    say("the dispatcher StatefulSet, the load balancer and both controllers are Ready")
    controller_pods = Watch(LOG_FOLLOWER.on_event, "pods", "-n", CONTROLLER_NS)
    controller_pods.start()
    go_controller_pods = Watch(GO_LOG_FOLLOWER.on_event, "pods", "-n", GO_CONTROLLER_NS)
    go_controller_pods.start()
    if ALERTS:
        ALERTS.start()
        say(f"Prometheus on {ALERTS.addr} scrapes the tier's pods and evaluates "
            f"{alert_e2e.ALERT} (logs in {ALERTS.dir})")
    ported, ported_pods = [], [Watch(p.logs.on_event, "pods", "-n", p.controller_ns)
                               for p in PORTED]
    for p, watch in zip(PORTED, ported_pods):
        watch.start()
        ported.append(p.start())
    phase("baseline", baseline, writing=False)
    if FROM_ROOT:
        phase(f"upgrade {FROM_VERSION}", upgrade)
        phase("scale 2 -> 1", scale(1))
        phase(f"downgrade {FROM_VERSION}", downgrade)
    elif SHORT:
        phase("rolling update", rolling_update)
        phase("SIGKILL", kill_dispatcher)
        phase("LB leader", loadbalancer_leader)
        phase("Lease refused", ALERTS.run)
        phase("scale 2 -> 1", scale(1))
    else:
        phase("rolling update", rolling_update)
        phase("pod deleted", delete_pod)
        phase("SIGKILL", kill_dispatcher)
        phase("LB leader", loadbalancer_leader)
        phase("Lease refused", ALERTS.run)
        phase("eviction", evictions)
        phase("scale 2 -> 4", scale(4))
        phase("scale 4 -> 1", scale(1))
    # The change written as the rolling update began: settled now, after every phase.
    ported += [p.settle("change") for p in PORTED]
    ported += [p.finish() for p in PORTED]
    for watch in ported_pods:
        watch.stop()
    kdctl_exit = kdctl_status()
    controller_pods.stop()
    go_controller_pods.stop()
    pods.stop()
    objects.stop()

    print("\ne2e summary")
    print(f"  {'phase':<16}{'seconds':>8}{'writes':>8}{'reconciles':>11}{'Go':>7}{'lost':>6}"
          f"{'concurrent':>11}{'longest write to reconcile':>28}{'Go':>10}"
          f"{'p99':>10}{'Go':>10}{'key waited':>13}{'Go':>10}")
    for r in results:
        print(f"  {r['phase']:<16}{r['seconds']:>8.1f}{r['writes']:>8}{r['reconciles']:>11}"
              f"{r['go_reconciles']:>7}{r['lost']:>6}{r['concurrent']:>11}"
              f"{r['worst'][0] * 1000:>25.0f} ms{r['go_worst'][0] * 1000:>7.0f} ms"
              f"{r['p99'] * 1000:>7.0f} ms{r['go_p99'] * 1000:>7.0f} ms"
              f"{r['waited'][0] * 1000:>10.0f} ms{r['go_waited'][0] * 1000:>7.0f} ms")
    for r in results:
        for name, seconds, code in r["drains"]:
            print(f"  {r['phase']}: {name} drained in {seconds:.1f} s, exit code {code}")
        for name, seconds in r["handovers"]:
            print(f"  {r['phase']}: {name} Ready again {seconds:.1f} s after it was told to stop")
        if r["note"]:
            print(f"  {r['phase']}: {r['note']}")
    # Every write is reconciled at least once: fewer reconciles read from the controllers'
    # logs would mean logs went unread, and "concurrent 0" would prove nothing.
    ok = all(r["lost"] == 0 and r["concurrent"] == 0 and r["reconciles"] >= r["writes"]
             and r["go_reconciles"] >= r["writes"] for r in results)
    ok = ok and kdctl_exit == 0
    print(f"  kdctl status with only a kubeconfig: exit {kdctl_exit}")
    for p in PORTED:
        runs = p.logs.runs()
        overlaps = concurrent(runs)
        steps = [s for s in ported if s["language"] == p.language]
        print(f"  ported controllers ({p.overlay}): {len(runs)} reconciles, "
              f"concurrent {overlaps}, steps: " + ", ".join(
                  f"{s['step']} {'settled' if not s['wrong'] else 'NOT settled'} "
                  f"in {s['seconds']:.1f} s" for s in steps))
        ok = ok and overlaps == 0 and len(runs) > 0 and not any(s["wrong"] for s in steps)
    if not SHORT and not FROM_ROOT:
        ok = ok and PDB_REFUSED == [True]
        print(f"  PodDisruptionBudget refused the second eviction: {PDB_REFUSED == [True]}")
    print(flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        code = main()
    finally:
        stop_background()
    sys.exit(code)
