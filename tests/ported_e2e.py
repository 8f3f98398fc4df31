"""The ported controllers' scenario of `make e2e` (tests/e2e.py runs it on the real node).

Each SDK's ported example controllers, as `kubectl apply -k` would apply their overlay: the Go
SDK's Bundle and Mirror controllers (deploy/examples/ported-go: controller-sdk/go/examples/ported,
written as kubebuilder writes them, in one manager) and the Rust SDK's (deploy/examples/ported-rust:
controller-sdk/examples/ported, written as kube-rs's guide writes them, in one process), each
with two replicas, their CRDs and what the dispatchers must read for them. Each language keeps
to a namespace of its own (WATCH_NAMESPACE), e2e-ported for Go and e2e-ported-rust for Rust,
where:

1. start: Bundles, and Mirrors of ConfigMaps, are created; each Bundle must come to own
   exactly its copies, with its data, and say so in its status at its generation; each Mirror
   must hold its finalizer, mark its ConfigMap and record the hash of its data in its status;
2. change (written as the tier's rolling update begins, so that it is reconciled while the
   dispatchers are replaced): a Bundle scaled down, a Bundle's data changed, a Mirror's
   ConfigMap changed;
3. finish (after one controller pod is deleted, so the other and its replacement carry on):
   a Mirror deleted must unmark its ConfigMap before it goes; a ConfigMap deleted leaves its
   Mirror reporting the hash it last saw, and the Mirror is told (event ConfigMapMissing).

Each step waits until every check passes (or its deadline, and then says what is wrong).
Overlapping reconciles of one key on the two replicas are read from their logs as for the
other controllers.
"""

import hashlib
import json
import time

DEPLOYMENT = "ported-controllers"
GROUP = "examples.kube-dispatch.dev"
MIRRORED_BY = f"{GROUP}/mirrored-by"
FINALIZER = f"{GROUP}/release"
BUNDLES = {"bundle-0": (3, {"k": "zero"}), "bundle-1": (2, {"k": "one"}), "bundle-2": (4, {"k": "two"})}
SOURCES = {f"source-{i}": {"data": f"v{i}"} for i in range(4)}
MIRRORS = {f"mirror-{i}": f"source-{i}" for i in range(4)}
TIMEOUT = 180


def data_hash(data):
    """What the Mirror controller records (mirrors.DataHash): SHA-256 of the keys and values in
    key order, each followed by a NUL."""
    h = hashlib.sha256()
    for k in sorted(data):
        h.update(f"{k}\0{data[k]}\0".encode())
    return h.hexdigest()


# Each language's overlay, its image, its controllers' namespace, and the namespace they
# reconcile.
GO = {"language": "Go", "overlay": "deploy/examples/ported-go", "image": "kube-dispatch-go-hasher",
      "controller_ns": "ported-go", "namespace": "e2e-ported"}
RUST = {"language": "Rust", "overlay": "deploy/examples/ported-rust", "image": "kube-dispatch",
        "controller_ns": "ported-rust", "namespace": "e2e-ported-rust"}


class Ported:
    def __init__(self, kubectl, say, flavour, logs):
        """`flavour` is GO or RUST; `logs` follows the controllers' pods (tests/e2e.py's
        ControllerLogs) and gives their reconciles."""
        self.kubectl = kubectl
        self.flavour, self.logs = flavour, logs
        self.language = flavour["language"]
        self.overlay, self.controller_ns = flavour["overlay"], flavour["controller_ns"]
        self.namespace = flavour["namespace"]
        self.say = lambda line: say(f"ported controllers ({self.language}): {line}")
        # What each object should come to: Bundles (copies, data), Mirrors' ConfigMaps' data
        # (None once deleted), and the Mirrors deleted.
        self.bundles = dict(BUNDLES)
        self.sources = {name: dict(data) for name, data in SOURCES.items()}
        self.deleted_mirrors = set()
        self.last_hash = {}

    def apply(self, root, host_aliases, tag):
        """The overlay as kustomize builds it, with what this node lacks (the load balancer's
        name in a host alias) and the JSON logs the reconciles are read from."""
        import yaml
        built = self.kubectl("kustomize", f"{root}/{self.overlay}")
        documents = [o for o in yaml.safe_load_all(built) if o]
        for o in documents:
            if o["kind"] == "Deployment":
                pod = o["spec"]["template"]["spec"]
                pod["hostAliases"] = host_aliases
                container = pod["containers"][0]
                container["image"] = f"{self.flavour['image']}:{tag}"
                env = [e for e in container.get("env", []) if e["name"] != "WATCH_NAMESPACE"]
                container["env"] = env + [{"name": "WATCH_NAMESPACE", "value": self.namespace}]
                if self.flavour is GO:
                    container["args"] += ["--zap-log-level=2", "--zap-time-encoding=epoch"]
                else:
                    container["env"].append({"name": "KD_LOG_JSON", "value": "1"})
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     f"crd/bundles.{GROUP}", f"crd/mirrors.{GROUP}")

    def _apply_objects(self, objects):
        self.kubectl("-n", self.namespace, "apply", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": objects}))

    def _bundle(self, name):
        copies, data = self.bundles[name]
        return {"apiVersion": f"{GROUP}/v1", "kind": "Bundle", "metadata": {"name": name},
                "spec": {"copies": copies, "data": data}}

    def _source(self, name):
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                "data": self.sources[name]}

    def start(self):
        self.kubectl("create", "namespace", self.namespace, check=False)
        self._apply_objects([self._source(n) for n in self.sources])
        self._apply_objects([self._bundle(n) for n in self.bundles])
        self._apply_objects([{"apiVersion": f"{GROUP}/v1", "kind": "Mirror", "metadata": {"name": m},
                              "spec": {"configMapName": s}} for m, s in MIRRORS.items()])
        return self.settle("start")

    def change(self):
        self.bundles["bundle-0"] = (1, self.bundles["bundle-0"][1])
        self.bundles["bundle-1"] = (self.bundles["bundle-1"][0], {"k": "one, changed"})
        self.sources["source-0"] = {"data": "v0, changed"}
        self._apply_objects([self._bundle("bundle-0"), self._bundle("bundle-1"),
                             self._source("source-0")])

    def finish(self):
        pods = json.loads(self.kubectl("-n", self.controller_ns, "get", "pods", "-o", "json"))["items"]
        if pods:
            victim = pods[0]["metadata"]["name"]
            self.say(f"deleting controller pod {victim}")
            self.kubectl("-n", self.controller_ns, "delete", "pod", victim, "--wait=false")
        self.kubectl("-n", self.namespace, "delete", f"mirrors.{GROUP}", "mirror-1", "--wait=false")
        self.deleted_mirrors.add("mirror-1")
        self.kubectl("-n", self.namespace, "delete", "configmap", "source-2")
        self.sources["source-2"] = None
        return self.settle("finish")

    def unsettled(self):
        """What is not yet as it should be, one line each."""
        wrong = []
        get = lambda kind: json.loads(self.kubectl("-n", self.namespace, "get", kind, "-o", "json"))["items"]
        configmaps = {c["metadata"]["name"]: c for c in get("configmaps")}
        for b in get(f"bundles.{GROUP}"):
            name = b["metadata"]["name"]
            copies, data = self.bundles[name]
            owned = [c for c in configmaps.values()
                     if any(r.get("controller") and r["kind"] == "Bundle" and r["name"] == name
                            for r in c["metadata"].get("ownerReferences", []))]
            status = b.get("status", {})
            if len(owned) != copies or any(c.get("data") != data for c in owned):
                wrong.append(f"{name}: {len(owned)} copies, want {copies} with {data}")
            elif (status.get("readyCopies") != copies
                  or status.get("observedGeneration") != b["metadata"]["generation"]):
                wrong.append(f"{name}: status {status} at generation {b['metadata']['generation']}")
        mirrors = {m["metadata"]["name"]: m for m in get(f"mirrors.{GROUP}")}
        for name, source in MIRRORS.items():
            m, cm = mirrors.get(name), configmaps.get(source)
            marked = cm is not None and cm["metadata"].get("annotations", {}).get(MIRRORED_BY)
            if name in self.deleted_mirrors:
                if m is not None or marked:
                    wrong.append(f"{name}: deleted, still there ({m is not None}) or "
                                 f"{source} still marked ({bool(marked)})")
                continue
            if m is None:
                wrong.append(f"{name}: missing")
                continue
            status = m.get("status", {})
            want = data_hash(self.sources[source]) if self.sources[source] is not None \
                else self.last_hash.get(name)
            if FINALIZER not in m["metadata"].get("finalizers", []):
                wrong.append(f"{name}: no finalizer")
            elif cm is not None and marked != name:
                wrong.append(f"{name}: {source} marked by {marked!r}")
            elif status.get("dataHash") != want or status.get("observedGeneration") != m["metadata"]["generation"]:
                wrong.append(f"{name}: status {status}, want hash {want}")
            else:
                self.last_hash[name] = want
        return wrong

    def missing_events(self):
        """The Mirror of the deleted ConfigMap must have been told so."""
        events = json.loads(self.kubectl("-n", self.namespace, "get", "events.events.k8s.io", "-o",
                                         "json"))["items"]
        told = {e["regarding"]["name"] for e in events if e.get("reason") == "ConfigMapMissing"}
        return [] if "mirror-2" in told else ["mirror-2: no event ConfigMapMissing"]

    def settle(self, step):
        started = time.monotonic()
        while True:
            wrong = self.unsettled()
            if not wrong and step == "finish":
                wrong = self.missing_events()
            if not wrong or time.monotonic() - started > TIMEOUT:
                break
            time.sleep(1)
        took = time.monotonic() - started
        if wrong:
            self.say(f"{step}: NOT settled within {TIMEOUT} s: {'; '.join(wrong)}")
        else:
            self.say(f"{step}: settled in {took:.1f} s")
        return {"language": self.language, "step": step, "seconds": took, "wrong": wrong}

