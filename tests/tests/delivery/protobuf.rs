//! The dispatcher's protobuf reading against the real API server: every built-in resource it
//! serves, listed in protobuf and turned into JSON by the dispatcher's table of types, reads
//! exactly as the API server's own JSON of the same list (the same resourceVersion); and a
//! dispatcher that lists and watches ConfigMaps in protobuf hands its replica, for each
//! version, the JSON the API server answered the write with.

use std::time::Duration;

use futures::AsyncReadExt;
use kube::{
    Client,
    api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    discovery::Discovery,
};
use kube_dispatch_dispatcher::watch::protobuf::{self, Untranscodable};
use kube_dispatch_proto::v1::{Reason, ReconcileRequest};
use kube_dispatch_tests::{
    TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
};
use serde_json::{Value, json};
use tonic::codegen::http::{Request, header};

/// Objects with what JSON and protobuf write differently: pointers set to zero, plain fields
/// left zero, times, micro-times, durations, quantities, int-or-strings, raw JSON, bytes.
fn objects(ns: &str) -> Vec<(String, Value)> {
    let at = |path: &str| format!("/api/v1/namespaces/{ns}/{path}");
    let apis = |group: &str, path: &str| format!("/apis/{group}/namespaces/{ns}/{path}");
    let template = json!({
        "metadata": {"labels": {"app": "web"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "web", "image": "example.com/web:1",
                "ports": [{"containerPort": 8080, "name": "http"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1.5"}},
                "readinessProbe": {"httpGet": {"port": "http", "path": "/ready"}, "periodSeconds": 3},
                "env": [{"name": "EMPTY", "value": ""}],
            }],
        },
    });
    vec![
        (
            at("configmaps"),
            json!({"metadata": {"name": "plain", "annotations": {"a": "<&> \u{2028}"}},
                   "data": {"k": "v", "empty": ""}, "binaryData": {"b": "AAEC/w=="}, "immutable": false}),
        ),
        (
            at("secrets"),
            json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"k": "c2VjcmV0"}}),
        ),
        (
            at("services"),
            json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [
                {"name": "a", "port": 80, "targetPort": "http"},
                {"name": "b", "port": 81, "targetPort": 8081}]}}),
        ),
        (
            apis("apps/v1", "deployments"),
            json!({"metadata": {"name": "web"}, "spec": {
                "replicas": 0, "selector": {"matchLabels": {"app": "web"}}, "template": template,
                "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}}}}),
        ),
        (
            // The API server fills in its claim templates' apiVersion and kind, which
            // protobuf does not carry: read in JSON (the table leaves it out).
            apis("apps/v1", "statefulsets"),
            json!({"metadata": {"name": "db"}, "spec": {
                "replicas": 0, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}},
                             "spec": {"containers": [{"name": "db", "image": "example.com/db"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}),
        ),
        (
            apis("apps/v1", "controllerrevisions"),
            json!({"metadata": {"name": "rev"}, "revision": 3, "data": {"spec": {"replicas": 2}}}),
        ),
        (
            apis("coordination.k8s.io/v1", "leases"),
            json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15,
                   "renewTime": "2026-12-01T10:00:00.123456Z", "acquireTime": "2026-12-01T09:00:00.000000Z",
                   "leaseTransitions": 0}}),
        ),
        (
            apis("events.k8s.io/v1", "events"),
            json!({"metadata": {"name": "e"}, "eventTime": "2026-12-01T10:00:00.500000Z",
                   "reportingController": "example.com/c", "reportingInstance": "c-1",
                   "action": "Sync", "reason": "Synced", "type": "Normal",
                   "regarding": {"kind": "ConfigMap", "name": "plain", "namespace": ns}}),
        ),
        (
            apis("batch/v1", "cronjobs"),
            json!({"metadata": {"name": "c"}, "spec": {"schedule": "*/5 * * * *", "suspend": true,
                   "jobTemplate": {"spec": {"backoffLimit": 0, "template": {"spec": {
                       "restartPolicy": "Never", "containers": [{"name": "j", "image": "example.com/j"}]}}}}}}),
        ),
        (
            apis("autoscaling/v2", "horizontalpodautoscalers"),
            json!({"metadata": {"name": "h"}, "spec": {"maxReplicas": 3,
                   "scaleTargetRef": {"kind": "Deployment", "name": "web", "apiVersion": "apps/v1"},
                   "metrics": [{"type": "Resource", "resource": {"name": "memory",
                       "target": {"type": "AverageValue", "averageValue": "500Mi"}}}]}}),
        ),
        (
            apis("policy/v1", "poddisruptionbudgets"),
            json!({"metadata": {"name": "p"}, "spec": {"maxUnavailable": "10%", "selector": {}}}),
        ),
        (
            apis("networking.k8s.io/v1", "networkpolicies"),
            json!({"metadata": {"name": "n"}, "spec": {"podSelector": {}, "ingress": [
                {"ports": [{"port": "http"}, {"port": 53, "protocol": "UDP"}]}]}}),
        ),
        (
            at("resourcequotas"),
            json!({"metadata": {"name": "q"}, "spec": {"hard": {"pods": "10", "requests.cpu": "2500m"}}}),
        ),
    ]
}

/// Objects compared of each resource: its first page.
const PAGE: usize = 500;

/// `path` read with `accept`.
async fn read(client: &Client, path: &str, accept: &str) -> TestResult<Vec<u8>> {
    let request = Request::get(path)
        .header(header::ACCEPT, accept)
        .body(Vec::new())?;
    let mut body = Vec::new();
    let mut stream = client
        .request_stream(request)
        .await
        .map_err(|e| format!("reading {path}: {e}"))?;
    stream.read_to_end(&mut body).await?;
    Ok(body)
}

/// A list's items by namespace and name.
fn sorted(items: &Value) -> Vec<&Value> {
    let mut items: Vec<&Value> = items.as_array().into_iter().flatten().collect();
    items.sort_by_key(|o| {
        let meta = &o["metadata"];
        (meta["namespace"].as_str(), meta["name"].as_str())
    });
    items
}

#[tokio::test]
async fn every_built_in_resource_reads_in_protobuf_as_the_api_server_writes_it_in_json()
-> TestResult {
    let ns = TestNamespace::create("protobuf").await?;
    let client = ns.client();
    for (path, body) in objects(ns.name()) {
        let request = Request::post(&path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&body)?)?;
        client
            .request_text(request)
            .await
            .map_err(|e| format!("creating at {path}: {e}"))?;
    }

    let discovery = Discovery::new(client.clone()).run().await?;
    let (mut resources, mut objects, mut in_json) = (0, 0, Vec::new());
    let mut mismatches = Vec::new();
    for group in discovery.groups() {
        for version in group.versions() {
            for (resource, caps) in group.versioned_resources(version) {
                if !caps.supports_operation(kube::discovery::verbs::LIST) {
                    continue;
                }
                let list = match resource.group.as_str() {
                    "" => format!("/api/{}/{}", resource.version, resource.plural),
                    group => format!("/apis/{group}/{}/{}", resource.version, resource.plural),
                };
                let accept = format!("{}, application/json", protobuf::MEDIA_TYPE);
                // A first page: what another suite (a benchmark) left in the cluster is not
                // read whole.
                let body = read(&client, &format!("{list}?limit={PAGE}"), &accept).await?;
                if !body.starts_with(protobuf::MAGIC) {
                    // Custom resources: the API server serves them in JSON (CBOR aside).
                    in_json.push(format!("{} (served in JSON)", resource.api_version));
                    continue;
                }
                let text = match protobuf::to_json(&body) {
                    Ok(text) => text,
                    Err(Untranscodable::UnknownKind(kind)) => {
                        in_json.push(kind);
                        continue;
                    }
                    Err(e) => return Err(format!("{list}: {e}").into()),
                };
                let ours: Value = serde_json::from_str(&text)?;
                let version = ours["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default();
                // The same list in JSON, at the resourceVersion the protobuf list was read at
                // (a resource that is not stored has none: ComponentStatus).
                let exact = match version {
                    "" => format!("{list}?limit={PAGE}"),
                    _ => format!(
                        "{list}?limit={PAGE}&resourceVersion={version}&resourceVersionMatch=Exact"
                    ),
                };
                let theirs: Value =
                    serde_json::from_slice(&read(&client, &exact, "application/json").await?)?;
                // In one order: ComponentStatuses are probed at once and listed as they answer.
                let (ours, theirs) = (sorted(&ours["items"]), sorted(&theirs["items"]));
                resources += 1;
                objects += theirs.len();
                if ours != theirs {
                    mismatches.push(format!(
                        "{list}:\n  protobuf: {ours:?}\n  JSON:     {theirs:?}"
                    ));
                }
            }
        }
    }
    println!(
        "{resources} resources, {objects} objects compared; read in JSON: {}",
        in_json.join(", ")
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert!(
        in_json.iter().any(|k| k == "apps/v1 StatefulSetList"),
        "StatefulSets are read in JSON: {in_json:?}"
    );
    // Every created kind was among them, and the cluster's own objects besides.
    assert!(resources >= 40, "{resources} resources compared");
    assert!(objects >= 100, "{objects} objects compared");
    Ok(())
}

/// A ConfigMap with what protobuf and JSON write differently: bytes, an empty value, escapes.
fn config_map(name: &str, value: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "annotations": {"note": "<&> \u{2028} é"}, "labels": {"app": "web"}},
        "data": {"value": value, "empty": ""},
        "binaryData": {"bytes": "AAEC/w=="},
    })
}

/// The delivery of `name` at `version` in `got`, its body read.
fn body_of(got: &[ReconcileRequest], name: &str, version: &str) -> Option<Value> {
    got.iter()
        .rev()
        .find(|r| {
            r.object.as_ref().is_some_and(|o| o.name == name) && r.resource_version == version
        })
        .and_then(|r| serde_json::from_slice(&r.object_json).ok())
}

#[tokio::test]
async fn a_dispatcher_reading_in_protobuf_hands_replicas_the_api_servers_json() -> TestResult {
    const TIMEOUT: Duration = Duration::from_secs(30);
    let ns = TestNamespace::create("protobuf-delivery").await?;
    let resource =
        kube::discovery::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ns.client(), ns.name(), &resource);
    let json = |o: &DynamicObject| serde_json::to_value(o);
    // Listed: made before the watch starts.
    let listed = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(config_map("listed", "1"))?,
        )
        .await?;

    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let mut s = TestSession::open(
        &d,
        "g",
        "r1",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    let version = |o: &DynamicObject| o.metadata.resource_version.clone().unwrap_or_default();
    let got = s
        .collect_until(TIMEOUT, |got| {
            body_of(got, "listed", &version(&listed)).is_some()
        })
        .await;
    assert_eq!(
        body_of(&got, "listed", &version(&listed)),
        Some(json(&listed)?)
    );

    // Watched: added, changed, deleted.
    let added = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(config_map("watched", "1"))?,
        )
        .await?;
    let got = s
        .collect_until(TIMEOUT, |got| {
            body_of(got, "watched", &version(&added)).is_some()
        })
        .await;
    assert_eq!(
        body_of(&got, "watched", &version(&added)),
        Some(json(&added)?)
    );
    let patch = json!({"data": {"value": "2"}, "metadata": {"annotations": {"note": null}}});
    let changed = api
        .patch("watched", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let got = s
        .collect_until(TIMEOUT, |got| {
            body_of(got, "watched", &version(&changed)).is_some()
        })
        .await;
    assert_eq!(
        body_of(&got, "watched", &version(&changed)),
        Some(json(&changed)?)
    );
    api.delete("watched", &DeleteParams::default()).await?;
    let got = s
        .collect_until(TIMEOUT, |got| {
            got.iter()
                .any(|r| r.deleted && r.object.as_ref().is_some_and(|o| o.name == "watched"))
        })
        .await;
    let deleted = got
        .iter()
        .find(|r| r.deleted)
        .expect("the deletion is delivered");
    assert_eq!(Reason::try_from(deleted.reason), Ok(Reason::Deleted));

    // All of it read in protobuf: the list's object and the watch's three.
    let protobuf = d.watch_total(|c| &c.protobuf);
    let seen = d.watch_total(|c| &c.applied) + d.watch_total(|c| &c.deleted);
    assert_eq!((protobuf, d.watch_total(|c| &c.json_fallbacks)), (seen, 0));
    assert!(seen >= 4, "{seen} objects seen");
    d.stop().await;
    Ok(())
}
