//! Floods that would hold the door shut (`proto/kubedispatch/v1/security.md`, "Threats and
//! bounds"): TLS handshakes that never finish and TLS connections that never speak, from twenty
//! addresses, each reopened a tenth of a second after the dispatcher closes it. A new replica's
//! session still opens, and its first poll is answered, within a second. The flood runs on
//! threads of its own ([`Attackers`]), as it would from pods of its own: it shares the
//! machine's cores with the dispatcher, not the dispatcher's runtime.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use kube_dispatch_telemetry::metrics::Metrics;
use kube_dispatch_tests::{
    TestResult,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
    flood::Attackers,
};
use tokio_util::sync::CancellationToken;

/// Addresses of the flood: 127.0.0.2 to 127.0.0.21 (the whole of 127/8 is loopback).
const ADDRESSES: u8 = 20;
/// Per address: connections that stall their handshake, and that finish it and say nothing.
const STALLED: usize = 20;
const SILENT: usize = 5;

/// The dispatcher's count of connections closed at `bound` (`kube_dispatch_refused_total`).
fn refused(metrics: &Metrics, bound: &'static str) -> u64 {
    metrics.refusals().count(bound)
}

/// Waits until the dispatcher has refused the flood `n` handshakes: it holds what it may.
async fn await_refused(metrics: &Metrics, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while refused(metrics, "handshakes_per_peer") + refused(metrics, "handshakes") < n {
        assert!(
            Instant::now() < deadline,
            "the flood was refused fewer than {n} handshakes in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Five replicas in turn, each on a new connection: a session opened and a poll answered,
/// each within 1 s; the slowest. A replica that took longer says whether its connection (TCP,
/// TLS and HTTP/2) was made by then.
async fn new_replicas(d: &TestDispatcher, metrics: &Metrics) -> TestResult<Duration> {
    let mut slowest = Duration::ZERO;
    for i in 0..5 {
        let started = Instant::now();
        let mut connected = None;
        let opened = tokio::time::timeout(Duration::from_secs(1), async {
            let client = d.client_as(&kube_dispatch_tests::credentials()).await;
            connected = Some(started.elapsed());
            TestSession::open_with(
                client,
                "g",
                &format!("r{i}"),
                vec![subscription("v1", "ConfigMap", "default")],
            )
            .await
        })
        .await;
        let mut session = opened.map_err(|_| match connected {
            Some(after) => format!(
                "replica {i}: connected after {after:?}, but no session within 1 s of the flood"
            ),
            None => format!("replica {i}: not even connected within 1 s of the flood"),
        })??;
        let polled = session.poll_acking(&[], Duration::from_millis(1)).await;
        assert!(polled.is_ok(), "replica {i}: {polled:?}");
        println!(
            "replica {i}: polled {:?} after it connected (refused so far: {} in all, {} per address)",
            started.elapsed(),
            refused(metrics, "handshakes"),
            refused(metrics, "handshakes_per_peer")
        );
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        slowest < Duration::from_secs(1),
        "slowest new replica: {slowest:?}"
    );
    Ok(slowest)
}

/// A dispatcher counting its refusals in a registry of the test's own.
async fn dispatcher() -> TestResult<(TestDispatcher, Metrics)> {
    let metrics = Metrics::default();
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.metrics = metrics.clone();
    Ok((TestDispatcher::start(config).await?, metrics))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_and_silent_connections_do_not_lock_new_replicas_out() -> TestResult {
    let (d, metrics) = dispatcher().await?;
    let stop = CancellationToken::new();
    let attackers = Attackers::start()?;
    let flood = attackers.handle().spawn(kube_dispatch_tests::flood::flood(
        d.addr,
        (ADDRESSES, STALLED, SILENT),
        crate::tls_connector()?,
        stop.clone(),
    ));
    await_refused(&metrics, 100).await;
    let slowest = new_replicas(&d, &metrics).await?;
    println!("slowest new replica under the flood: {slowest:?}");
    stop.cancel();
    flood.await?;
    d.stop().await;
    Ok(())
}

/// From 300 addresses, one stalled handshake each: the bound per address never bites, and the
/// flood holds every general place. A replica whose address authenticated before (it had a
/// session) still connects, through the places kept for known peers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_many_addresses_leaves_known_replicas_their_places() -> TestResult {
    let (d, metrics) = dispatcher().await?;
    TestSession::open(
        &d,
        "g",
        "before",
        vec![subscription("v1", "ConfigMap", "default")],
    )
    .await?;
    let stop = CancellationToken::new();
    let attackers = Attackers::start()?;
    let mut flood = tokio::task::JoinSet::new();
    for a in 0..300u16 {
        let [hi, lo] = (a + 256).to_be_bytes();
        flood.spawn_on(
            kube_dispatch_tests::flood::hold(
                d.addr,
                Ipv4Addr::new(127, 0, hi, lo),
                None,
                stop.clone(),
            ),
            attackers.handle(),
        );
    }
    await_refused(&metrics, 100).await;
    assert_eq!(refused(&metrics, "handshakes_per_peer"), 0);
    let slowest = new_replicas(&d, &metrics).await?;
    println!("slowest known replica under the flood: {slowest:?}");
    stop.cancel();
    while flood.join_next().await.is_some() {}
    d.stop().await;
    Ok(())
}
