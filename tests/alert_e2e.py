"""The alert phase of `make e2e` (tests/e2e.py runs it on the real node): one fault makes its
alert fire in a real Prometheus, and the alert resolves once the fault ends.

Prometheus (tests/cluster/prometheus.sh's) runs on this machine and scrapes the tier's pods
as the PodMonitor of deploy/components/monitoring does: every pod of namespace kube-dispatch,
on its container port named admin, every 2 s. The distribution's Prometheus is built without
Kubernetes service discovery, so the pods are written to a file it watches (file_sd_configs),
read from the API server when the phase starts. Its rules are deploy/prometheus/kube-dispatch-alerts.yaml's
KubeDispatchLeaseRenewalsFailing, with its rate windows (5m) and its `for` (2m) shortened to
WINDOW and FOR so that the phase takes a minute, not ten.

The fault: a ValidatingAdmissionPolicy refuses every write of kube-dispatch-dispatcher-1's
Lease, as an API server that rejects one dispatcher's renewals would (its identity's RBAC
changed, an admission webhook misbehaving). The alert must fire for that dispatcher (and, when
it does, for no other), within its `for`, an evaluation and a scrape of its expression holding
(Prometheus's activeAt), and within the window, the `for`, two scrapes and SLACK of the fault's
start; the policy is then removed, and the alert must resolve within the window, two scrapes
and SLACK, every dispatcher Ready again before the next phase. Meanwhile the
dispatcher is fenced, the others take its keys once its Lease has expired, and it rejoins: the
phase's writes must still be reconciled, none lost, none twice at once.
"""

import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request

ALERT = "KubeDispatchLeaseRenewalsFailing"
DISPATCHER = "kube-dispatch-dispatcher-1"
POLICY = "e2e-lease-writes-refused"
WINDOW = 10
FOR = 5
SCRAPE = 2
EVALUATION = 1
# The longest the alert may take to fire, and to resolve, past what the rule itself needs.
SLACK = 30


def since_epoch(rfc3339):
    """Prometheus's RFC 3339 time (nanoseconds, Z) as seconds since the epoch."""
    from datetime import datetime
    whole, _, rest = rfc3339.rstrip("Z").partition(".")
    fraction = float("0." + rest.split("+")[0]) if rest else 0.0
    return datetime.fromisoformat(whole + "+00:00").timestamp() + fraction


def rules_for_e2e(root):
    """The shipped rules file's KubeDispatchLeaseRenewalsFailing alone, its windows shortened."""
    with open(os.path.join(root, "deploy", "prometheus", "kube-dispatch-alerts.yaml")) as f:
        text = f.read()
    start = text.index(f"      - alert: {ALERT}\n")
    end = text.find("\n      - alert: ", start + 1)
    rule = text[start:] if end < 0 else text[start:end + 1]
    if rule.count("[5m]") != 2 or rule.count("for: 2m\n") != 1:
        raise SystemExit(f"e2e: the rule is not as the alert phase expects it:\n{rule}")
    rule = rule.replace("[5m]", f"[{WINDOW}s]").replace("for: 2m\n", f"for: {FOR}s\n")
    return f"groups:\n  - name: e2e\n    rules:\n{rule}"


def prometheus_config():
    """Scrapes the targets of targets.json (the tier's pods, their admin port)."""
    return {
        "global": {"scrape_interval": f"{SCRAPE}s", "scrape_timeout": f"{SCRAPE}s",
                   "evaluation_interval": f"{EVALUATION}s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [{
            "job_name": "kube-dispatch",
            "file_sd_configs": [{"files": ["targets.json"]}],
        }],
    }


def targets(pods):
    """Each running pod's container port named admin, with the pod's name as label `pod`."""
    found = []
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        ports = [p["containerPort"] for c in pod["spec"]["containers"]
                 for p in c.get("ports", []) if p.get("name") == "admin"]
        if ip and ports:
            found.append({"targets": [f"{ip}:{ports[0]}"],
                          "labels": {"pod": pod["metadata"]["name"]}})
    return found


def policy(namespace):
    """The fault: writes of DISPATCHER's Lease in `namespace` refused at admission."""
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": POLICY},
         "spec": {
             "failurePolicy": "Fail",
             "matchConstraints": {"resourceRules": [{
                 "apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                 "operations": ["CREATE", "UPDATE"], "resources": ["leases"]}]},
             "validations": [{"expression": f"object.metadata.name != '{DISPATCHER}'",
                              "message": "e2e fault: this dispatcher's Lease writes are refused"}],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": POLICY},
         "spec": {"policyName": POLICY, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": namespace}}}}},
    ]


class AlertFault:
    def __init__(self, kubectl, say, root, logs, namespace, background):
        self.kubectl, self.say = kubectl, say
        self.root, self.dir = root, os.path.join(logs, "prometheus")
        self.namespace = namespace
        self.background = background
        self.addr = None

    def start(self):
        """Prometheus, with its rules and its discovery of the tier's pods, once ready."""
        import yaml
        binaries = subprocess.run([os.path.join(self.root, "tests", "cluster", "prometheus.sh")],
                                  check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
        subprocess.run(["rm", "-rf", self.dir], check=True)
        os.makedirs(self.dir)
        with open(os.path.join(self.dir, "rules.yaml"), "w") as f:
            f.write(rules_for_e2e(self.root))
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as f:
            yaml.safe_dump(prometheus_config(), f)
        self.discover()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.addr = f"127.0.0.1:{s.getsockname()[1]}"
        with open(os.path.join(self.dir, "prometheus.log"), "w") as log:
            self.background([os.path.join(binaries, "prometheus"),
                             f"--config.file={self.dir}/prometheus.yml",
                             f"--storage.tsdb.path={self.dir}/data",
                             f"--web.listen-address={self.addr}"],
                            stdout=subprocess.DEVNULL, stderr=log)
        self._until(30, "Prometheus ready", lambda: self._get("/-/ready") is not None)

    def discover(self):
        """The tier's pods as they are now, in the file Prometheus watches (written whole, then
        moved into place)."""
        pods = json.loads(self.kubectl("-n", self.namespace, "get", "pods", "-o", "json"))["items"]
        path = os.path.join(self.dir, "targets.json")
        with open(path + ".new", "w") as f:
            json.dump(targets(pods), f)
        os.replace(path + ".new", path)

    def _get(self, path):
        try:
            with urllib.request.urlopen(f"http://{self.addr}{path}", timeout=5) as answer:
                return answer.read().decode()
        except OSError:
            return None

    def _query(self, query):
        answer = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": query}))
        return json.loads(answer)["data"]["result"] if answer else []

    def alerts(self):
        """This alert's instances now: pod -> (state, when its expression began to hold, in
        seconds since the epoch); None while Prometheus does not answer (so that no wait
        takes silence for an answer)."""
        answer = self._get("/api/v1/alerts")
        if answer is None:
            return None
        return {a["labels"].get("pod"): (a["state"], since_epoch(a["activeAt"]))
                for a in json.loads(answer)["data"]["alerts"]
                if a["labels"].get("alertname") == ALERT}

    def firing(self):
        """The pods this alert fires for now, once Prometheus answers (within 30 s)."""
        deadline = time.monotonic() + 30
        while (alerts := self.alerts()) is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"e2e: Prometheus did not answer for 30 s ({self.dir}/prometheus.log)")
            time.sleep(0.5)
        return {pod for pod, (state, _) in alerts.items() if state == "firing"}

    def _until(self, seconds, what, done):
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                raise SystemExit(f"e2e: {what}: not within {seconds} s "
                                 f"(Prometheus's log: {self.dir}/prometheus.log)")
            time.sleep(0.5)
        return time.monotonic()

    def run(self):
        """The phase's action: the fault, the alert firing, the fault gone, the alert resolved.
        Returns what it measured."""
        import yaml
        # The pods of now (a rolling update replaced them), each dispatcher scraped twice at
        # least, so its renewals have a rate to show.
        self.discover()
        self._until(60, "every dispatcher scraped", lambda: len(self._query(
            "count by (pod) (count_over_time("
            f"kube_dispatch_lease_renewals_total{{outcome=\"accepted\"}}[{WINDOW}s]) >= 2)")) >= 3)
        before = self.firing()
        if before:
            raise SystemExit(f"e2e: {ALERT} fires before any fault: {before}")
        began = time.monotonic()
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(policy(self.namespace)))
        limit = FOR + WINDOW + 2 * SCRAPE + SLACK
        seen = {}

        def fires():
            state, active = (self.alerts() or {}).get(DISPATCHER, (None, None))
            if state == "firing":
                seen.update(wall=time.time(), active=active)
            return state == "firing"

        fired = self._until(limit, f"{ALERT} firing for {DISPATCHER}", fires) - began
        # From its expression holding to its firing seen here (the answer's arrival): the
        # rule's `for`, then up to an evaluation, and the look that saw it, within a scrape.
        pending = seen["wall"] - seen["active"]
        if pending > FOR + EVALUATION + SCRAPE:
            raise SystemExit(f"e2e: {ALERT} fired {pending:.1f} s after its expression held "
                             f"(its `for` is {FOR} s)")
        others = self.firing() - {DISPATCHER}
        if others:
            raise SystemExit(f"e2e: {ALERT} fires for dispatchers whose writes go through: {others}")
        ended = time.monotonic()
        self.kubectl("delete", "validatingadmissionpolicybinding", POLICY)
        self.kubectl("delete", "validatingadmissionpolicy", POLICY)
        resolved = self._until(WINDOW + 2 * SCRAPE + SLACK, f"{ALERT} resolved",
                               lambda: DISPATCHER not in self.firing()) - ended
        # Every dispatcher Ready again (the refused one rejoined, the others' handovers over)
        # before the next phase: an eviction would find the disruption budget spent.
        self.kubectl("-n", self.namespace, "rollout", "status",
                     "statefulset/kube-dispatch-dispatcher", "--timeout", "300s")
        return (f"{ALERT} fired for {DISPATCHER} {fired:.1f} s after its Lease writes were "
                f"refused, {pending:.1f} s after its expression held (rule: for {FOR} s over a "
                f"{WINDOW} s window, scrapes every {SCRAPE} s), resolved {resolved:.1f} s after "
                f"the fault ended")
