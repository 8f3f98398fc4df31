//! The manifests in `deploy/` against the real API server: the base and every overlay pass a
//! server-side dry run, and once applied, the RBAC they grant is least privilege, checked with
//! `kubectl auth can-i` as each service account. `deploy/tls.sh` makes a Secret per server
//! role that controllers verify; the cert-manager component issues the same names.

use std::{path::PathBuf, process::Output, time::Duration};

use kube_dispatch_tests::{Cluster, TestResult};

fn deploy(path: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
        .display()
        .to_string()
}

fn kubectl(args: &[&str]) -> Output {
    Cluster::shared()
        .kubectl()
        .args(args)
        .output()
        .expect("run kubectl")
}

fn ok(args: &[&str]) -> String {
    let out = kubectl(args);
    assert!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `subject` may `verb resource` (in `namespace`, or cluster-wide with `-A`).
fn can(subject: &str, verb: &str, resource: &str, namespace: &str) -> bool {
    let as_ = format!("--as=system:serviceaccount:{subject}");
    let scope = if namespace.is_empty() {
        vec!["-A".to_owned()]
    } else {
        vec!["-n".to_owned(), namespace.to_owned()]
    };
    let mut args = vec!["auth", "can-i", verb, resource, &as_];
    args.extend(scope.iter().map(String::as_str));
    let out = kubectl(&args);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

const DISPATCHER: &str = "kube-dispatch:kube-dispatch-dispatcher";
const LOADBALANCER: &str = "kube-dispatch:kube-dispatch-loadbalancer";
const CONTROLLER: &str = "configmap-hasher:configmap-hasher";
const KDCTL: &str = "kube-dispatch:kdctl";
/// A person who runs kdctl, bound to the Role kube-dispatch-operator as deploy/ says to.
const ONCALL: &str = "kube-dispatch:oncall";

#[tokio::test]
async fn manifests_apply_and_grant_least_privilege() -> TestResult {
    let base = deploy("base");
    let example = deploy("examples/configmap-hasher");
    // Namespaced objects dry-run only into namespaces that exist; an earlier run's may still
    // be terminating.
    for ns in ["kube-dispatch", "configmap-hasher"] {
        let _ = kubectl(&[
            "wait",
            "--for=delete",
            &format!("namespace/{ns}"),
            "--timeout=120s",
        ]);
        let _ = kubectl(&["create", "namespace", ns]);
    }
    for dir in [&base, &example] {
        let out = ok(&["apply", "--dry-run=server", "-k", dir]);
        assert!(
            out.contains("statefulset.apps/kube-dispatch-dispatcher"),
            "{out}"
        );
    }

    ok(&["apply", "-k", &example]);
    // The example grants the dispatchers ConfigMaps through aggregation, which the controller
    // manager fills in.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !can(DISPATCHER, "watch", "configmaps", "") || !can(KDCTL, "get", "configmaps", "default")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dispatchers' or kdctl's ClusterRole never aggregated the ConfigMap rules"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ok(&[
        "-n",
        "kube-dispatch",
        "create",
        "rolebinding",
        "test-oncall-kdctl",
        "--role=kube-dispatch-operator",
        "--serviceaccount=kube-dispatch:oncall",
    ]);
    let expectations = [
        // Dispatchers: read what the controllers subscribe to, manage their Leases.
        (DISPATCHER, "get", "configmaps", "", true),
        (DISPATCHER, "list", "configmaps", "", true),
        (DISPATCHER, "watch", "configmaps", "", true),
        (DISPATCHER, "patch", "configmaps", "default", false),
        (DISPATCHER, "list", "secrets", "", false),
        (DISPATCHER, "list", "pods", "", false),
        (DISPATCHER, "create", "leases", "kube-dispatch", true),
        (
            DISPATCHER,
            "delete",
            "leases/kube-dispatch-dispatcher-2",
            "kube-dispatch",
            true,
        ),
        (
            DISPATCHER,
            "update",
            "leases/kube-dispatch-dispatcher-0",
            "kube-dispatch",
            true,
        ),
        (
            DISPATCHER,
            "patch",
            "leases/kube-dispatch-loadbalancer",
            "kube-dispatch",
            false,
        ),
        (DISPATCHER, "create", "leases", "default", false),
        // ... and verify callers: who they are, and whether they may list and watch.
        (DISPATCHER, "create", "tokenreviews", "", true),
        (DISPATCHER, "create", "subjectaccessreviews", "", true),
        (
            DISPATCHER,
            "create",
            "serviceaccounts/token",
            "kube-dispatch",
            false,
        ),
        // Load balancer: Leases in its namespace, nothing else.
        (LOADBALANCER, "watch", "leases", "kube-dispatch", true),
        (
            LOADBALANCER,
            "patch",
            "leases/kube-dispatch-loadbalancer",
            "kube-dispatch",
            true,
        ),
        (
            LOADBALANCER,
            "patch",
            "leases/kube-dispatch-dispatcher-0",
            "kube-dispatch",
            false,
        ),
        (LOADBALANCER, "create", "leases", "kube-dispatch", true),
        (LOADBALANCER, "delete", "leases", "kube-dispatch", false),
        (LOADBALANCER, "get", "leases", "default", false),
        (LOADBALANCER, "list", "configmaps", "", false),
        (LOADBALANCER, "create", "tokenreviews", "", true),
        (LOADBALANCER, "create", "subjectaccessreviews", "", false),
        // The example controller: what it would need without the tier (list and watch
        // ConfigMaps, which the dispatchers check), get and patch; nothing else.
        (CONTROLLER, "get", "configmaps", "default", true),
        (CONTROLLER, "patch", "configmaps", "default", true),
        (CONTROLLER, "list", "configmaps", "", true),
        (CONTROLLER, "watch", "configmaps", "", true),
        (CONTROLLER, "create", "tokenreviews", "", false),
        (CONTROLLER, "delete", "configmaps", "default", false),
        (CONTROLLER, "get", "secrets", "default", false),
        (CONTROLLER, "get", "leases", "kube-dispatch", false),
        // kdctl's account: the operator API, nothing else; controllers may not drain.
        (KDCTL, "get", "/kube-dispatch/status", "", true),
        (KDCTL, "post", "/kube-dispatch/drain", "", true),
        (KDCTL, "post", "/kube-dispatch/reconcile", "", true),
        (KDCTL, "get", "/kube-dispatch/drain", "", false),
        (KDCTL, "list", "configmaps", "", false),
        // ... and get what the example controller's groups watch, so `kdctl owner` shows them.
        (KDCTL, "get", "configmaps", "default", true),
        (KDCTL, "watch", "configmaps", "", false),
        (KDCTL, "list", "leases", "kube-dispatch", false),
        (CONTROLLER, "post", "/kube-dispatch/drain", "", false),
        (CONTROLLER, "post", "/kube-dispatch/reconcile", "", false),
        (DISPATCHER, "post", "/kube-dispatch/drain", "", false),
        // Whoever runs kdctl with the operator Role: find the dispatchers and the CA bundle
        // the tier publishes, and nothing else of the namespace (no Secret, no other
        // ConfigMap).
        (ONCALL, "list", "leases", "kube-dispatch", true),
        (
            ONCALL,
            "get",
            "configmaps/kube-dispatch-ca",
            "kube-dispatch",
            true,
        ),
        (ONCALL, "get", "configmaps/other", "kube-dispatch", false),
        (
            ONCALL,
            "get",
            "secrets/kube-dispatch-dispatcher-tls",
            "kube-dispatch",
            false,
        ),
        (ONCALL, "get", "/kube-dispatch/status", "", false),
    ];
    let wrong: Vec<String> = expectations
        .iter()
        .filter(|(who, verb, what, ns, allowed)| can(who, verb, what, ns) != *allowed)
        .map(|(who, verb, what, ns, allowed)| {
            format!(
                "{who} {} {verb} {what} in {}",
                if *allowed { "cannot" } else { "can" },
                if ns.is_empty() { "all namespaces" } else { ns }
            )
        })
        .collect();
    ok(&["delete", "-k", &example, "--wait=false"]);
    assert!(wrong.is_empty(), "RBAC is not as intended: {wrong:#?}");
    Ok(())
}

/// The workloads use what the binaries read in a pod: identity and namespaces from the
/// downward API, the in-cluster API configuration, and no flags beyond what the manifests set.
#[test]
fn workloads_get_their_identity_from_the_downward_api() {
    let rendered = ok(&["kustomize", &deploy("examples/configmap-hasher")]);
    for (env, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_IP", "status.podIP"),
    ] {
        let at = rendered
            .find(&format!("name: {env}"))
            .unwrap_or_else(|| panic!("{env} is not set"));
        assert!(
            rendered[at..].contains(&format!("fieldPath: {field}")),
            "{env} should come from {field}"
        );
    }
    // Every container names the tag (an overlay's own workloads are outside the base's
    // `images:`; untagged, the kubelet would pull :latest) and uses an image already there.
    let images: Vec<&str> = rendered
        .lines()
        .filter(|l| l.trim_start().starts_with("image:"))
        .map(str::trim)
        .collect();
    assert_eq!(images, ["image: kube-dispatch:dev"; 3], "{images:?}");
    assert_eq!(rendered.matches("imagePullPolicy: IfNotPresent").count(), 3);
    assert!(!rendered.contains("KUBECONFIG"));
}

/// Every workload reaches the tier over TLS with a projected token for the tier's audience,
/// verifying the one name the certificate carries, and is probed on its admin port over HTTP
/// (the kubelet's gRPC probes speak neither TLS with our CA nor a token).
#[test]
fn workloads_speak_tls_with_projected_tokens() {
    let rendered = ok(&["kustomize", &deploy("examples/configmap-hasher")]);
    let audiences = rendered.matches("audience: kube-dispatch\n").count();
    assert_eq!(
        audiences, 2,
        "dispatchers and controller mount a projected token"
    );
    // A certificate per server role.
    assert_eq!(
        rendered
            .matches("secretName: kube-dispatch-loadbalancer-tls")
            .count(),
        1
    );
    assert_eq!(
        rendered
            .matches("name: kube-dispatch-dispatcher-tls\n")
            .count(),
        1
    );
    assert!(!rendered.contains("kube-dispatch-tls"), "no shared Secret");
    assert!(rendered.contains("name: kube-dispatch-ca\n"));
    for var in ["KD_TLS_CERT_FILE", "KD_TLS_KEY_FILE"] {
        assert_eq!(rendered.matches(var).count(), 2, "{var} on both servers");
    }
    assert_eq!(
        rendered
            .matches("value: kube-dispatch-dispatcher.kube-dispatch.svc\n")
            .count(),
        2,
        "the dispatchers (calling peers) and the controller verify the Service name"
    );
    assert!(!rendered.contains("KD_INSECURE") && !rendered.contains("KD_ALLOW_ANONYMOUS"));
    assert!(!rendered.contains("http://"), "addresses carry no scheme");
    assert!(
        !rendered.contains("grpc:\n              port"),
        "no gRPC probe"
    );
    assert_eq!(rendered.matches("path: /readyz").count(), 3);
    assert_eq!(rendered.matches("path: /healthz").count(), 3);
    for port in [
        "containerPort: 9070",
        "containerPort: 9071",
        "containerPort: 9080",
    ] {
        assert!(rendered.contains(port), "admin port {port}");
    }
    // The certificate cert-manager issues carries that name.
    let issued = ok(&["kustomize", &deploy("examples/cert-manager")]);
    assert!(issued.contains("kind: Certificate"));
    assert!(issued.contains("- kube-dispatch-dispatcher.kube-dispatch.svc\n"));
    for role in ["dispatcher", "loadbalancer"] {
        assert!(issued.contains(&format!("secretName: kube-dispatch-{role}-tls\n")));
    }
    let dispatchers = issued
        .split("\n---\n")
        .find(|doc| {
            doc.contains("kind: Certificate\n")
                && doc.contains("secretName: kube-dispatch-dispatcher-tls\n")
        })
        .unwrap_or_default();
    assert!(
        dispatchers.contains("- kube-dispatch-dispatcher.kube-dispatch.svc\n")
            && !dispatchers.contains("loadbalancer"),
        "the dispatchers' certificate names them only: {dispatchers}"
    );
    assert!(issued.matches("namespace: kube-dispatch\n").count() >= 4);
    // Issued where the dispatchers mount them: every Issuer and Certificate in the tier's
    // namespace, not in whatever namespace kubectl defaults to.
    for doc in issued
        .split("\n---\n")
        .filter(|doc| doc.contains("kind: Certificate\n") || doc.contains("kind: Issuer\n"))
    {
        assert!(
            doc.contains("\n  namespace: kube-dispatch\n"),
            "not in namespace kube-dispatch: {doc}"
        );
    }
}

/// `deploy/tls.sh` makes a Secret per server role and the CA controllers verify them by: a
/// dispatcher serving its certificate on 127.0.0.1 is verified under the dispatchers' Service
/// name (pods are dialled by IP), not under another; a server with the load balancer's
/// certificate is verified under the load balancer's name and refused under the dispatchers'
/// (it cannot pose as one); running the script again renews under the same CA.
#[tokio::test]
async fn the_tls_script_makes_a_secret_per_role_that_clients_verify() -> TestResult {
    use kube_dispatch_proto::credentials::Credentials;
    use kube_dispatch_server::tls::{ServerTls, Transport};
    use kube_dispatch_tests::{
        TestNamespace,
        dispatcher::{TestDispatcher, test_config},
    };
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let tier = TestNamespace::create("tls-script").await?;
    let controllers = TestNamespace::create("tls-script-controller").await?;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(tier.name());
    let run = || {
        let cluster = Cluster::shared();
        let out = std::process::Command::new(deploy("tls.sh"))
            .args(["--dir", &dir.display().to_string()])
            .args(["--namespace", tier.name()])
            .args(["--controller-namespace", controllers.name()])
            .env("KUBECTL", cluster.kubectl().get_program())
            .env("KUBECONFIG", cluster.kubeconfig())
            .output()
            .expect("run deploy/tls.sh");
        assert!(
            out.status.success(),
            "deploy/tls.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read(dir.join("dispatcher.crt")).expect("dispatcher.crt")
    };
    let first = run();
    let ca = std::fs::read(dir.join("ca.crt"))?;
    for role in ["dispatcher", "loadbalancer"] {
        let keys = ok(&[
            "get",
            "secret",
            &format!("kube-dispatch-{role}-tls"),
            "-n",
            tier.name(),
            "-o",
            "go-template={{range $k, $v := .data}}{{$k}} {{end}}",
        ]);
        assert_eq!(keys.trim(), "ca.crt tls.crt tls.key", "{role}");
    }
    let published = ok(&[
        "get",
        "configmap",
        "kube-dispatch-ca",
        "-n",
        controllers.name(),
        "-o",
        "go-template={{index .data \"ca.crt\"}}",
    ]);
    assert_eq!(published.as_bytes(), ca.as_slice());

    let serve = |role: &str| {
        let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
        config.security.transport = Transport::Tls(ServerTls::new(
            dir.join(format!("{role}.crt")),
            dir.join(format!("{role}.key")),
        ));
        TestDispatcher::start(config)
    };
    let health = |d: &TestDispatcher, name: String| {
        let credentials = Credentials::tls(dir.join("ca.crt")).with_server_name(name);
        let address = d.addr.to_string();
        async move {
            let channel = credentials.endpoint(&address)?.connect().await?;
            HealthClient::new(channel)
                .check(HealthCheckRequest::default())
                .await?;
            Ok::<_, kube_dispatch_tests::TestError>(())
        }
    };
    let (dispatchers, load_balancer) = (
        format!("kube-dispatch-dispatcher.{}.svc", tier.name()),
        format!("kube-dispatch-loadbalancer.{}.svc", tier.name()),
    );
    let d = serve("dispatcher").await?;
    health(&d, dispatchers.clone()).await?;
    for other in ["kube-dispatch-dispatcher.elsewhere.svc", &load_balancer] {
        assert!(
            health(&d, other.to_owned()).await.is_err(),
            "a name the certificate does not carry was accepted: {other}"
        );
    }
    d.stop().await;
    let lb = serve("loadbalancer").await?;
    health(&lb, load_balancer).await?;
    assert!(
        health(&lb, dispatchers).await.is_err(),
        "the load balancer's certificate passed as the dispatchers'"
    );
    lb.stop().await;

    let second = run();
    assert_ne!(first, second, "the serving certificate was renewed");
    assert_eq!(std::fs::read(dir.join("ca.crt"))?, ca, "under the same CA");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Each server has a NetworkPolicy: its gRPC port open to the cluster's pods, its admin port to
/// labelled namespaces only; the dispatchers' Lease names cover the StatefulSet's replicas;
/// the body pool is half the dispatcher's memory limit.
#[test]
fn network_policies_lease_names_and_memory_match_the_workloads() {
    let rendered = ok(&["kustomize", &deploy("base")]);
    let docs: Vec<&str> = rendered.split("\n---\n").collect();
    let policies: Vec<&&str> = docs
        .iter()
        .filter(|d| d.lines().any(|l| l == "kind: NetworkPolicy"))
        .collect();
    assert_eq!(policies.len(), 2, "{rendered}");
    for component in ["kube-dispatch-dispatcher", "kube-dispatch-loadbalancer"] {
        let policy = policies
            .iter()
            .find(|p| p.contains(&format!("app.kubernetes.io/name: {component}\n")))
            .unwrap_or_else(|| panic!("no NetworkPolicy selects {component}"));
        for needle in [
            "port: grpc",
            "port: admin",
            "namespaceSelector: {}",
            "kube-dispatch.dev/metrics: \"true\"",
        ] {
            assert!(policy.contains(needle), "{component}: {needle}\n{policy}");
        }
    }
    let replicas: usize = docs
        .iter()
        .find(|d| d.contains("kind: StatefulSet"))
        .and_then(|d| d.lines().find_map(|l| l.trim().strip_prefix("replicas: ")))
        .and_then(|r| r.parse().ok())
        .expect("the StatefulSet's replicas");
    for i in 0..replicas {
        assert!(
            rendered.contains(&format!("- kube-dispatch-dispatcher-{i}\n")),
            "the Role does not name dispatcher {i}'s Lease"
        );
    }
    let body_pool = rendered
        .split("name: KD_MAX_BODY_BYTES\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .map(str::trim);
    assert_eq!(body_pool, Some("value: \"268435456\""));
    assert!(rendered.contains("memory: 512Mi"));
}

#[test]
fn the_monitoring_component_scrapes_every_process_on_its_admin_port_and_alerts() {
    let rendered = ok(&["kustomize", &deploy("examples/monitoring")]);
    let docs: Vec<&str> = rendered.split("\n---\n").collect();
    let kind = |doc: &str, kind: &str| doc.lines().any(|l| l == format!("kind: {kind}"));
    let monitors: Vec<&&str> = docs.iter().filter(|d| kind(d, "PodMonitor")).collect();
    assert_eq!(monitors.len(), 1, "{rendered}");
    let monitor = monitors[0];
    for needle in [
        "kube-dispatch.dev/scrape: \"true\"",
        "port: admin",
        "path: /metrics",
        "any: true",
    ] {
        assert!(
            monitor.contains(needle),
            "PodMonitor lacks {needle}:\n{monitor}"
        );
    }
    // The alerts come with it, each linking to its runbook section.
    let rules: Vec<&&str> = docs.iter().filter(|d| kind(d, "PrometheusRule")).collect();
    assert_eq!(rules.len(), 1, "{rendered}");
    let alerts = rules[0].matches("- alert: ").count();
    let runbooks = rules[0].matches("runbook_url: https://").count();
    assert!(
        alerts >= 10 && runbooks == alerts,
        "{alerts} alerts, {runbooks} runbook links"
    );
    // Every workload's pods carry the label and name their admin port, so each is scraped.
    let workloads: Vec<&&str> = docs
        .iter()
        .filter(|d| kind(d, "StatefulSet") || kind(d, "Deployment"))
        .collect();
    assert_eq!(
        workloads.len(),
        3,
        "dispatchers, load balancer, example controller"
    );
    for w in workloads {
        assert!(
            w.contains("kube-dispatch.dev/scrape: \"true\"") && w.contains("name: admin"),
            "not scraped:\n{w}"
        );
    }
}
