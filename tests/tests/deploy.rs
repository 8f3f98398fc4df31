//! The manifests in `deploy/` against the real API server: the base and every overlay pass a
//! server-side dry run, and once applied, the RBAC they grant is least privilege, checked with
//! `kubectl auth can-i` as each service account.

use std::{path::PathBuf, process::Output, time::Duration};

use kube_dispatch_tests::Cluster;

type TestResult = Result<(), Box<dyn std::error::Error>>;

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
    while !can(DISPATCHER, "watch", "configmaps", "") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dispatchers' ClusterRole never aggregated the ConfigMap rules"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let expectations = [
        // Dispatchers: read what the controllers subscribe to, manage their Leases.
        (DISPATCHER, "get", "configmaps", "", true),
        (DISPATCHER, "list", "configmaps", "", true),
        (DISPATCHER, "watch", "configmaps", "", true),
        (DISPATCHER, "patch", "configmaps", "default", false),
        (DISPATCHER, "list", "secrets", "", false),
        (DISPATCHER, "list", "pods", "", false),
        (DISPATCHER, "create", "leases", "kube-dispatch", true),
        (DISPATCHER, "delete", "leases", "kube-dispatch", true),
        (DISPATCHER, "create", "leases", "default", false),
        // Load balancer: Leases in its namespace, nothing else.
        (LOADBALANCER, "watch", "leases", "kube-dispatch", true),
        (LOADBALANCER, "patch", "leases", "kube-dispatch", true),
        (LOADBALANCER, "delete", "leases", "kube-dispatch", false),
        (LOADBALANCER, "get", "leases", "default", false),
        (LOADBALANCER, "list", "configmaps", "", false),
        // The example controller: get and patch ConfigMaps; no list or watch (no cache).
        (CONTROLLER, "get", "configmaps", "default", true),
        (CONTROLLER, "patch", "configmaps", "default", true),
        (CONTROLLER, "list", "configmaps", "", false),
        (CONTROLLER, "watch", "configmaps", "", false),
        (CONTROLLER, "delete", "configmaps", "default", false),
        (CONTROLLER, "get", "secrets", "default", false),
        (CONTROLLER, "get", "leases", "kube-dispatch", false),
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
    assert!(rendered.contains("image: kube-dispatch:dev"));
    assert!(!rendered.contains("KUBECONFIG"));
}
