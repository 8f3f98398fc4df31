//! The reconnect storm: what a tier restart looks like to a few hundred controller replicas.
//!
//! [`STORM_SESSIONS`] replicas of one identity, each with a token and a connection of its own
//! (from one of [`STORM_ADDRESSES`] loopback addresses, as pods have addresses of their own),
//! in [`STORM_GROUPS`] groups over [`STORM_OBJECTS`] ConfigMaps. One replica after another,
//! [`STORM_RATE`] a second, reconnects: a new connection and an OpenSession (the dispatcher
//! replaces its old session), asked again after a refusal as the SDKs ask (their backoff, or
//! the dispatcher's pushback when it gives one); in between, each session polls and
//! acknowledges what it is given, as a replica does (each poll waits as the SDKs' polls wait).

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube_dispatch_proto::{credentials::Credentials, v1::dispatcher_client::DispatcherClient};
use kube_dispatch_tests::{
    TestNamespace,
    dispatcher::{TestSession, subscription},
    identity::token,
};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Counters, Opens};

/// Replicas, each with a session: the most one identity may hold
/// (`--max-sessions-per-identity`).
const STORM_SESSIONS: u64 = 1000;
/// Groups they are spread over.
const STORM_GROUPS: u64 = 10;
/// Reconnects a second.
const STORM_RATE: u64 = 200;
/// ConfigMaps each group reconciles.
const STORM_OBJECTS: usize = 1000;
/// How long each replica's poll waits for a key: what the SDKs ask (a quarter of the session's
/// ttl, the dispatcher's default of 10 s here; `controller-sdk/src/fence.rs`).
const REPLICA_POLL_WAIT: Duration = Duration::from_millis(2500);
/// Loopback addresses the replicas connect from (127.0.0.2 on), ten replicas each.
const STORM_ADDRESSES: u64 = 100;

/// Where the storm's replicas connect, with which tokens, and what they reconcile.
pub(super) struct Storm {
    /// The dispatcher's gRPC address.
    pub address: String,
    /// A token per replica.
    pub credentials: Vec<Credentials>,
    /// The namespace of the ConfigMaps.
    pub namespace: String,
}

/// A token of the identity `storm` of `ns` for each replica, as each pod has its own.
pub(super) async fn storm_tokens(
    ns: &TestNamespace,
    ca: &std::path::Path,
) -> anyhow::Result<Vec<Credentials>> {
    futures::stream::iter(0..STORM_SESSIONS)
        .map(|_| async {
            Ok::<_, anyhow::Error>(
                Credentials::tls(ca).with_token(token(ns, "storm", "kube-dispatch").await?),
            )
        })
        .buffered(16)
        .try_collect()
        .await
}

/// The ConfigMaps the storm's groups reconcile, created once.
pub(super) async fn storm_objects(api: &Api<ConfigMap>) -> anyhow::Result<()> {
    futures::stream::iter(0..STORM_OBJECTS)
        .map(|i| async move {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("storm-{i}")},
                "data": {"v": "x"},
            }))?;
            api.patch(
                &format!("storm-{i}"),
                &PatchParams::apply("bench-hostile").force(),
                &Patch::Apply(&cm),
            )
            .await?;
            anyhow::Ok(())
        })
        .buffer_unordered(16)
        .try_collect::<()>()
        .await
}

/// Runs the storm until `stop`, counting reconnects and refusals in `counters` and each
/// reconnect's time in `opens`.
pub(super) async fn run(
    storm: Storm,
    stop: CancellationToken,
    (attempts, refused): Counters,
    opens: Opens,
) -> anyhow::Result<()> {
    let mut replicas = JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / STORM_RATE));
    let mut n: u64 = 0;
    while !stop.is_cancelled() {
        tick.tick().await;
        let replica = n % STORM_SESSIONS;
        n += 1;
        #[allow(clippy::cast_possible_truncation)]
        let (credentials, from) = (
            storm.credentials[replica as usize].clone(),
            Ipv4Addr::new(127, 0, 0, 2 + (replica % STORM_ADDRESSES) as u8),
        );
        let endpoint = credentials
            .endpoint(&storm.address)?
            .local_address(Some(IpAddr::V4(from)));
        let namespace = storm.namespace.clone();
        let (attempts, refused, opens, stop) = (
            attempts.clone(),
            refused.clone(),
            opens.clone(),
            stop.clone(),
        );
        replicas.spawn(async move {
            attempts.fetch_add(1, Ordering::Relaxed);
            let begun = Instant::now();
            let record = |opens: &Opens| {
                let took = u64::try_from(begun.elapsed().as_micros()).unwrap_or(u64::MAX);
                opens.lock().unwrap_or_else(|e| e.into_inner()).push(took);
            };
            let group = format!("storm-{}", replica % STORM_GROUPS);
            let name = format!("replica-{replica}");
            let mut failures = 0u32;
            let mut session = loop {
                let opened = async {
                    let channel = endpoint
                        .connect()
                        .await
                        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                    let client = DispatcherClient::with_interceptor(channel, credentials.bearer());
                    TestSession::open_with(
                        client,
                        &group,
                        &name,
                        vec![subscription("v1", "ConfigMap", &namespace)],
                    )
                    .await
                };
                match opened.await {
                    Ok(session) => break session,
                    Err(status) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        let wait = retry_after(&status, failures, replica);
                        failures += 1;
                        tokio::select! {
                            () = stop.cancelled() => {
                                record(&opens);
                                return;
                            }
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                }
            };
            record(&opens);
            // Until the session is replaced (this replica's next reconnect) or the run ends.
            let mut acks: Vec<u64> = Vec::new();
            while !stop.is_cancelled() {
                match session.poll_acking(&acks, REPLICA_POLL_WAIT).await {
                    Ok(got) => acks = got.iter().map(|r| r.delivery_id).collect(),
                    Err(_) => return,
                }
            }
        });
        // Reap the replicas whose sessions were replaced.
        while replicas.try_join_next().is_some() {}
    }
    replicas.shutdown().await;
    Ok(())
}

/// How long a replica waits after its `failures`-th refusal, as the SDKs wait: 100 ms doubling
/// to 30 s, or the pushback the dispatcher gave (at most 30 s) if longer; each with a jitter of
/// up to as much again (drawn from `seed`, so runs are alike).
fn retry_after(status: &tonic::Status, failures: u32, seed: u64) -> Duration {
    let jittered = |base: u64, salt: u64| {
        let jitter = seed
            .wrapping_add(u64::from(failures) ^ salt)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(17)
            % (base + 1);
        base + jitter
    };
    let backoff = jittered((100u64 << failures.min(9)).min(30_000), 0);
    let pushback = kube_dispatch_proto::pushback_of(status).map_or(0, |wait| {
        jittered(
            u64::try_from(wait.as_millis())
                .unwrap_or(u64::MAX)
                .min(30_000),
            1,
        )
    });
    Duration::from_millis(backoff.max(pushback))
}
