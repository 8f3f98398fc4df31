//! Traces across the hop, exported over OTLP to a receiver in this test: the dispatcher's span
//! for a watched change and the replica's reconcile span it caused share one trace, the
//! reconcile span a child of the change span. Alone in its test binary, because it installs
//! the process's tracing subscriber.

use std::{sync::Arc, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt as _,
    api::{Patch, PatchParams, PostParams},
};
use kube_dispatch_controller::{Action, Controller};
use kube_dispatch_tests::{
    TestNamespace, TestResult,
    dispatcher::{TestDispatcher, test_config},
};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value,
    trace::v1::Span,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// An OTLP trace receiver: every span exported to it, as it arrives.
struct Receiver(mpsc::UnboundedSender<Span>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let _ = self.0.send(span);
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attribute(span: &Span, name: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == name)
        .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            other => Some(format!("{other:?}")),
        })
}

#[tokio::test]
async fn a_reconcile_span_is_a_child_of_the_dispatchers_span_for_the_change() -> TestResult {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let (spans_tx, mut spans) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(spans_tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let traces =
        kube_dispatch_telemetry::logging::init_with_traces(false, Some(&endpoint), "test")?;

    let ns = TestNamespace::create("traces").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let (done, mut reconciled) = mpsc::unbounded_channel::<String>();
    let stop = CancellationToken::new();
    let controller = Controller::<ConfigMap>::new(ns.client(), "traced")
        .namespace(ns.name())
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .graceful_shutdown_on(stop.clone().cancelled_owned());
    let task = tokio::spawn(
        controller
            .run(
                |cm: Arc<ConfigMap>, done: Arc<mpsc::UnboundedSender<String>>| async move {
                    let _ = done.send(cm.resource_version().unwrap_or_default());
                    Ok::<_, kube::Error>(Action::await_change())
                },
                |_, _, _| Action::await_change(),
                Arc::new(done),
            )
            .for_each(|_| async {}),
    );
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("traced".into());
    api.create(&PostParams::default(), &cm).await?;
    tokio::time::timeout(Duration::from_secs(30), reconciled.recv()).await?;
    // A change after the replica is up: its trace is the one followed.
    let patched = api
        .patch(
            "traced",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "1"}})),
        )
        .await?;
    let version = patched.resource_version().unwrap_or_default();
    while tokio::time::timeout(Duration::from_secs(30), reconciled.recv())
        .await?
        .as_deref()
        != Some(version.as_str())
    {}
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;
    // Send what is batched.
    drop(traces);

    let key = format!("/ConfigMap/{}/traced", ns.name());
    let mut seen = Vec::new();
    let (change, reconcile) = loop {
        let span = tokio::time::timeout(Duration::from_secs(30), spans.recv())
            .await?
            .ok_or("the receiver stopped")?;
        seen.push(span);
        let of = |name: &str| {
            seen.iter().find(|s| {
                s.name == name
                    && attribute(s, "key").as_deref() == Some(key.as_str())
                    && attribute(s, "resource_version").as_deref() == Some(version.as_str())
            })
        };
        if let (Some(change), Some(reconcile)) = (of("change"), of("reconcile")) {
            break (change.clone(), reconcile.clone());
        }
    };
    assert_eq!(reconcile.trace_id, change.trace_id, "one trace");
    assert_eq!(
        reconcile.parent_span_id, change.span_id,
        "the reconcile span's parent is the change span"
    );
    assert!(!change.trace_id.iter().all(|b| *b == 0));
    d.stop().await;
    Ok(())
}
