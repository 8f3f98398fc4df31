//! The attacks of the threat table, each at the most its bound lets through until stopped,
//! counting the calls or connections it makes and those refused.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube_dispatch_proto::{
    credentials::Credentials,
    v1::{CloseSessionRequest, PollRequest, dispatcher_client::DispatcherClient},
};
use kube_dispatch_tests::dispatcher::{TestSession, subscription};
use tokio::{io::AsyncWriteExt, net::TcpStream, runtime::Handle, task::JoinSet};
use tokio_util::sync::CancellationToken;

use super::{Attack, Counters, Dispatcher, Fixture, Opens};

/// Starts `attack` on dispatcher `d`, counting its calls in `counters`, until `stop`: into
/// `attackers`, each attacker's tasks on the runtime `on` (threads of their own, as attackers
/// are pods of their own), what is measured on the caller's.
pub(super) async fn launch(
    attack: Attack,
    fixture: &Fixture,
    d: &Dispatcher,
    stop: &CancellationToken,
    counters: Counters,
    opens: &Opens,
    (attackers, on): (&mut JoinSet<anyhow::Result<()>>, &Handle),
) -> anyhow::Result<()> {
    let endpoint = |c: &Credentials| -> anyhow::Result<tonic::transport::Endpoint> {
        Ok(c.endpoint(&d.grpc.to_string())?)
    };
    match attack {
        Attack::None => {}
        Attack::IdleAdmin => {
            attackers.spawn_on(idle_admin(d.admin, stop.clone(), counters), on);
        }
        Attack::HealthStreams => {
            attackers.spawn_on(
                health_streams(
                    endpoint(&Credentials::tls(&fixture.ca))?,
                    stop.clone(),
                    counters,
                ),
                on,
            );
        }
        Attack::JunkTokens => {
            attackers.spawn_on(
                junk_tokens(
                    endpoint(&Credentials::tls(&fixture.ca))?,
                    stop.clone(),
                    counters,
                ),
                on,
            );
        }
        Attack::Connections => {
            attackers.spawn_on(
                connections(
                    endpoint(&Credentials::tls(&fixture.ca))?,
                    stop.clone(),
                    counters,
                ),
                on,
            );
        }
        Attack::BodyHog => {
            let hog = (endpoint(&fixture.hog)?, fixture.hog.clone());
            let namespace = fixture.hog_ns.name().to_owned();
            attackers.spawn_on(body_hog(hog, namespace, stop.clone(), counters), on);
        }
        Attack::HandshakeFlood => {
            attackers.spawn_on(flood(d.grpc, fixture.ca.clone(), stop.clone()), on);
            // The new replicas are what is measured: beside the legitimate controller.
            attackers.spawn(new_replicas(
                (endpoint(&fixture.legit)?, fixture.legit.clone()),
                fixture.legit_ns.name().to_owned(),
                stop.clone(),
                counters,
                opens.clone(),
            ));
        }
        Attack::ReconnectStorm => {
            let storm = super::storm::Storm {
                address: d.grpc.to_string(),
                credentials: fixture.storm.clone(),
                namespace: fixture.storm_ns.name().to_owned(),
            };
            attackers.spawn_on(
                super::storm::run(storm, stop.clone(), counters, opens.clone()),
                on,
            );
        }
    }
    Ok(())
}

/// Holds the handshake flood on `grpc` (its TLS clients trusting `ca`) until `stop`; spawned
/// where the attackers run, so its connections run there too.
async fn flood(grpc: SocketAddr, ca: PathBuf, stop: CancellationToken) -> anyhow::Result<()> {
    let tls = kube_dispatch_tests::flood::tls_connector(&ca)
        .map_err(|e| anyhow::anyhow!("the flood's TLS client: {e}"))?;
    kube_dispatch_tests::flood::flood(
        grpc,
        (FLOOD_ADDRESSES, FLOOD_STALLED, FLOOD_SILENT),
        tls,
        stop,
    )
    .await;
    Ok(())
}

/// The handshake flood: from 20 addresses, 100 connections each that never start their TLS
/// handshake and 25 that finish it and never speak: 2 000 and 500, reopened as they are closed.
const FLOOD_ADDRESSES: u8 = 20;
const FLOOD_STALLED: usize = 100;
const FLOOD_SILENT: usize = 25;

/// A new replica every 250 ms, each on a connection of its own, of a group of its own over
/// `namespace` (which the identity may read): its TLS handshake, its session opened and its
/// first poll answered, timed into `opens` (a second for one not done within a second, counted
/// refused); its session closed after.
async fn new_replicas(
    (endpoint, credentials): (tonic::transport::Endpoint, Credentials),
    namespace: String,
    stop: CancellationToken,
    (attempts, refused): Counters,
    opens: Opens,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut n = 0u64;
    while !stop.is_cancelled() {
        tick.tick().await;
        n += 1;
        attempts.fetch_add(1, Ordering::Relaxed);
        let begun = Instant::now();
        let replica = async {
            let channel = endpoint.connect().await.ok()?;
            let client = DispatcherClient::with_interceptor(channel, credentials.bearer());
            let mut session = TestSession::open_with(
                client,
                "fresh",
                &format!("fresh-{n}"),
                vec![subscription("v1", "ConfigMap", &namespace)],
            )
            .await
            .ok()?;
            session
                .poll_acking(&[], Duration::from_millis(1))
                .await
                .ok()?;
            Some((begun.elapsed(), session))
        };
        match tokio::time::timeout(Duration::from_secs(1), replica).await {
            Ok(Some((took, mut session))) => {
                opens
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
                let _ = session
                    .client
                    .close_session(CloseSessionRequest {
                        session_id: session.id.clone(),
                        ..Default::default()
                    })
                    .await;
            }
            _ => {
                refused.fetch_add(1, Ordering::Relaxed);
                opens
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(1_000_000);
            }
        }
    }
    Ok(())
}

/// 2 000 connections to the admin port, reopened as they are closed; every other one sends a
/// request head one byte a second.
async fn idle_admin(
    admin: SocketAddr,
    stop: CancellationToken,
    (attempts, refused): Counters,
) -> anyhow::Result<()> {
    let mut held: Vec<(TcpStream, bool)> = Vec::new();
    let head = b"GET /metrics HTTP/1.1\r\nHost: slow\r\n\r\n";
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut second = 0usize;
    while !stop.is_cancelled() {
        while held.len() < 2000 && !stop.is_cancelled() {
            attempts.fetch_add(1, Ordering::Relaxed);
            match TcpStream::connect(admin).await {
                Ok(stream) => {
                    let slow = held.len().is_multiple_of(2);
                    held.push((stream, slow));
                }
                Err(_) => {
                    refused.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        // One byte of the head on each slow connection; those the server closed are dropped.
        let byte = head[second % head.len()..][..1].to_vec();
        second += 1;
        let mut open = Vec::with_capacity(held.len());
        for (mut stream, slow) in held {
            let alive = if slow {
                stream.write_all(&byte).await.is_ok()
            } else {
                let mut probe = [0u8; 1];
                !matches!(stream.try_read(&mut probe), Ok(0))
            };
            if alive {
                open.push((stream, slow));
            } else {
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        held = open;
    }
    Ok(())
}

/// Health/Watch streams without a credential, 50 on each of 20 connections, opened again as
/// they are refused, about 200 attempts a second.
async fn health_streams(
    endpoint: tonic::transport::Endpoint,
    stop: CancellationToken,
    (attempts, refused): Counters,
) -> anyhow::Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut channels = Vec::new();
    for _ in 0..20 {
        channels.push(endpoint.connect().await?);
    }
    let mut open = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut n = 0usize;
    while !stop.is_cancelled() {
        tick.tick().await;
        if open.len() >= 1000 {
            continue;
        }
        let mut client = HealthClient::new(channels[n % channels.len()].clone());
        n += 1;
        attempts.fetch_add(1, Ordering::Relaxed);
        let watch = client.watch(HealthCheckRequest {
            service: String::new(),
        });
        match tokio::time::timeout(Duration::from_secs(2), watch).await {
            Ok(Ok(stream)) => open.push(stream.into_inner()),
            _ => {
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// 300 calls a second, each with a new token: opaque strings and, every other call, a JWT for
/// the tier's audience that expires in an hour and that no key signed.
async fn junk_tokens(
    endpoint: tonic::transport::Endpoint,
    stop: CancellationToken,
    (attempts, refused): Counters,
) -> anyhow::Result<()> {
    let channel = endpoint.connect().await?;
    let counter = Arc::new(AtomicU64::new(0));
    let next = counter.clone();
    let mut client =
        DispatcherClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            let token = if n.is_multiple_of(2) {
                format!("junk-{n}-{:016x}", rand_u64(n))
            } else {
                forged_jwt(n)
            };
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| tonic::Status::internal("header"))?;
            request.metadata_mut().insert("authorization", value);
            Ok(request)
        });
    let mut tick = tokio::time::interval(Duration::from_micros(3333));
    while !stop.is_cancelled() {
        tick.tick().await;
        attempts.fetch_add(1, Ordering::Relaxed);
        let answer = client
            .poll(PollRequest {
                session_id: "junk".into(),
                ..PollRequest::default()
            })
            .await;
        if answer.is_err() {
            refused.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// A cheap, varying number for junk tokens (no randomness needed, only difference).
fn rand_u64(n: u64) -> u64 {
    n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17)
}

fn forged_jwt(n: u64) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 3600;
    let header = b64.encode(r#"{"alg":"RS256","kid":"forged"}"#);
    let claims = b64.encode(format!(
        r#"{{"aud":["kube-dispatch"],"exp":{exp},"sub":"system:serviceaccount:x:forged-{n}"}}"#
    ));
    format!(
        "{header}.{claims}.{}",
        b64.encode(rand_u64(n).to_be_bytes())
    )
}

/// Every connection one peer may hold, kept, and 50 more attempts a second.
async fn connections(
    endpoint: tonic::transport::Endpoint,
    stop: CancellationToken,
    (attempts, refused): Counters,
) -> anyhow::Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut held = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    while !stop.is_cancelled() {
        tick.tick().await;
        attempts.fetch_add(1, Ordering::Relaxed);
        // A connection counts once it speaks: each is used for one health check.
        let opened = async {
            let channel = endpoint.connect().await.ok()?;
            HealthClient::new(channel.clone())
                .check(HealthCheckRequest::default())
                .await
                .ok()?;
            Some(channel)
        };
        match tokio::time::timeout(Duration::from_secs(2), opened).await {
            Ok(Some(channel)) => held.push(channel),
            _ => {
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        if held.len() > 256 {
            held.remove(0);
        }
    }
    Ok(())
}

/// Another tenant's group over 40 ConfigMaps of 1000 KiB in `namespace`, rewritten one after
/// another all along; its session (on `endpoint` with `credentials`) is kept alive with empty
/// acks and never polls. Its connections and its API client are made here, on the attackers'
/// runtime.
async fn body_hog(
    (endpoint, credentials): (tonic::transport::Endpoint, Credentials),
    namespace: String,
    stop: CancellationToken,
    (attempts, _refused): Counters,
) -> anyhow::Result<()> {
    let client =
        DispatcherClient::with_interceptor(endpoint.connect().await?, credentials.bearer());
    let mut hog = TestSession::open_with(
        client,
        "hog",
        "hog-0",
        vec![subscription("v1", "ConfigMap", &namespace)],
    )
    .await
    .context("the hog's OpenSession")?;
    let api: Api<ConfigMap> = Api::namespaced(
        kube_dispatch_tests::Cluster::shared().client().await?,
        &namespace,
    );
    let mut round = 0u64;
    let mut renewed = Instant::now();
    while !stop.is_cancelled() {
        for i in 0..40 {
            if stop.is_cancelled() {
                break;
            }
            let value = format!("{round}{}", "x".repeat(1000 * 1024));
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("big-{i}")},
                "data": {"v": value},
            }))?;
            api.patch(
                &format!("big-{i}"),
                &PatchParams::apply("bench-hostile").force(),
                &Patch::Apply(&cm),
            )
            .await?;
            attempts.fetch_add(1, Ordering::Relaxed);
            if renewed.elapsed() > Duration::from_secs(5) {
                hog.ack(&[]).await?;
                renewed = Instant::now();
            }
        }
        round += 1;
    }
    Ok(())
}
