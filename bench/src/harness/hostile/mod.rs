//! `make bench-hostile` (`kube-dispatch-bench hostile`): what each attack in
//! `proto/kubedispatch/v1/security.md`'s threat table costs a legitimate controller while it
//! runs at the most its bound lets through.
//!
//! One dispatcher binary (as shipped, cargo's `dist` profile; TLS and token reviews on, the defaults of every bound
//! but the body pool, held to `--max-body-bytes 32 MiB` so one run can fill it), against the
//! local control plane. In each run a legitimate controller (a ServiceAccount that may list and
//! watch its namespace's ConfigMaps) has a session open while a writer patches its ConfigMap
//! `--writes` times, one patch at a time: from sending each patch to the poll that hands the
//! change over is its write-to-reconcile time; a patch not handed over within 10 s is lost.
//! Meanwhile the admin endpoint's `/healthz` is asked every 100 ms, and one attack runs:
//!
//! | attack | what it does, at most what its bound lets through |
//! | --- | --- |
//! | none | (the baseline) |
//! | idle admin connections | 2 000 TCP connections to the admin port, kept open, half of them sending a request head one byte per second |
//! | health streams | Health/Watch streams without a credential on 20 connections, 50 each, reopened as they are refused |
//! | junk tokens | 300 calls a second, each with a new token: opaque strings and forged JWTs for the tier's audience |
//! | connections | every connection one peer may hold, and 50 more attempts a second |
//! | body hog | another tenant's group of 40 ConfigMaps of 1000 KiB, rewritten all along and never polled |
//! | reconnect storm | 1 000 replicas of one identity (its bound of sessions), each with a token and a connection of its own from one of 100 loopback addresses, in 10 groups over 1 000 ConfigMaps, each reconnecting every 5 s: 200 new connections and OpenSessions a second, what a tier restart looks like to a few hundred controller replicas; a refused open is asked again as the SDKs do (their backoff, or the dispatcher's pushback), and each session polls and acknowledges as a replica does |
//! | handshake flood and silent TLS connections | from 20 loopback addresses, 2 000 TCP connections to the gRPC port that never start their TLS handshake and 500 that finish it and never speak, each reopened 100 ms after the dispatcher closes it; meanwhile a new replica every 250 ms, each on a connection of its own, is timed from its connection to its first poll answered |
//!
//! The dispatcher takes its ring from Leases, as deployed: each session is listed on its Lease
//! before it is handed keys. The writes begin 3 s into an attack, one after another; under the
//! reconnect storm they begin with it, one every 100 ms, so they span its first thousand opens
//! and the reopens after. The report adds the storm's OpenSession answer times, the flood's new
//! replicas' times, and the writes of the Lease that were not accepted.
//!
//! Each attack gets a fresh dispatcher process, so its peak RSS (VmHWM) is the attack's own.
//! Runs alternate over the attacks `--repeats` times; the report gives medians over repeats.

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
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube_dispatch_proto::{credentials::Credentials, v1::dispatcher_client::DispatcherClient};
use kube_dispatch_tests::{
    Cluster, TestNamespace,
    dispatcher::{TestSession, subscription},
    identity::{account, token},
};
use serde::{Serialize, Serializer};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{
    admin::{counter_sum, http_status},
    process::Component,
    report::{median, percentile},
    security::{first_list, timed_write},
};

mod attacks;
mod results;
mod storm;

use attacks::launch;

/// What an attack made and what of it was refused.
type Counters = (Arc<AtomicU64>, Arc<AtomicU64>);

/// The reconnect storm's reconnect times, µs.
type Opens = Arc<std::sync::Mutex<Vec<u64>>>;

/// The body pool the benchmark's dispatcher runs with: small enough that the body hog fills it.
const BODY_POOL: usize = 32 * 1024 * 1024;
/// A write not handed over within this long is counted lost.
const LOST_AFTER: Duration = Duration::from_secs(10);

/// One attack of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Attack {
    /// No attack: the baseline every ratio is taken against, always run.
    None,
    /// Idle and slow connections to the admin port.
    IdleAdmin,
    /// Health streams opened without a credential.
    HealthStreams,
    /// Calls with a new junk token each.
    JunkTokens,
    /// Every connection one peer may hold, and more attempts.
    Connections,
    /// Another tenant's group of large objects, never polled.
    BodyHog,
    /// 1 000 replicas reconnecting, 200 a second.
    ReconnectStorm,
    /// Stalled TLS handshakes and silent TLS connections, with new replicas timed.
    HandshakeFlood,
}

impl Attack {
    pub(crate) const ALL: [Self; 8] = [
        Self::None,
        Self::IdleAdmin,
        Self::HealthStreams,
        Self::JunkTokens,
        Self::Connections,
        Self::BodyHog,
        Self::ReconnectStorm,
        Self::HandshakeFlood,
    ];

    /// What the JSON calls it.
    fn key(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::IdleAdmin => "idle_admin",
            Self::HealthStreams => "health_streams",
            Self::JunkTokens => "junk_tokens",
            Self::Connections => "connections",
            Self::BodyHog => "body_hog",
            Self::ReconnectStorm => "reconnect_storm",
            Self::HandshakeFlood => "handshake_flood",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::None => "none (baseline)",
            Self::IdleAdmin => "idle and slow admin connections",
            Self::HealthStreams => "health stream flood",
            Self::JunkTokens => "junk token flood",
            Self::Connections => "connection flood",
            Self::BodyHog => "body hog tenant",
            Self::ReconnectStorm => "reconnect storm",
            Self::HandshakeFlood => "handshake flood and silent TLS connections",
        }
    }

    fn bound(self) -> &'static str {
        match self {
            Self::None => "",
            Self::IdleAdmin => "1024 admin connections, 64 per peer, 2 s for a request head",
            Self::HealthStreams => "64 calls without a credential",
            Self::JunkTokens => "hopeless tokens unreviewed; 1 review/s per failing peer",
            Self::Connections => "128 connections per peer, 2 s to speak",
            Self::BodyHog => "body pool shared evenly per user (32 MiB here)",
            Self::ReconnectStorm => {
                "1000 sessions per identity, 64 opens at once, 200 new-token reviews/s, Lease writes for sessions every 200 ms"
            }
            Self::HandshakeFlood => {
                "256 handshakes at once, 8 per address, 2 s each; 2 s to speak after one; places kept for known peers"
            }
        }
    }
}

impl Attack {
    /// The attacks to run of those `asked` (all if none): in the table's order, the baseline
    /// first.
    pub(crate) fn chosen(asked: &[Self]) -> Vec<Self> {
        Self::ALL
            .into_iter()
            .filter(|a| *a == Self::None || asked.is_empty() || asked.contains(a))
            .collect()
    }

    /// How long the attack runs before the writes begin: until it holds what its bound lets
    /// through. None for the reconnect storm, whose first thousand opens (a tier restart) are
    /// the moment to measure.
    fn warmup(self) -> Duration {
        match self {
            Self::None | Self::ReconnectStorm => Duration::ZERO,
            _ => Duration::from_secs(3),
        }
    }

    /// The least time between the starts of two timed writes: for the reconnect storm 100 ms,
    /// so a hundred writes span its first thousand opens and the reopens after; for the others
    /// none (one after another).
    fn write_spacing(self) -> Duration {
        match self {
            Self::ReconnectStorm => Duration::from_millis(100),
            _ => Duration::from_nanos(1),
        }
    }
}

impl Serialize for Attack {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.key())
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// Runs of each attack.
    pub repeats: usize,
    /// Timed writes per run.
    pub writes: usize,
    /// The attacks to run, in the table's order, the baseline first (always among them).
    pub attacks: Vec<Attack>,
    /// The dispatcher binary.
    pub dispatcher: PathBuf,
    /// Where the dispatcher's logs go.
    pub logs: PathBuf,
}

/// One run under one attack.
#[derive(Debug, Default)]
struct Run {
    /// Write to reconcile, µs, of the writes handed over.
    deliveries: Vec<u64>,
    /// Of each, the time after the API server answered the write, µs: the watch's and the
    /// tier's part, without the write's own round trip.
    after_answers: Vec<u64>,
    /// Writes not handed over within [`LOST_AFTER`].
    lost: usize,
    /// `/healthz` answer times, µs; a probe with no answer within 1 s counts as 1 s.
    probes: Vec<u64>,
    /// The dispatcher's peak RSS, bytes.
    peak_rss: u64,
    /// What the attack did: calls or connections made, refused.
    attempts: u64,
    refused: u64,
    /// The reconnect storm's reconnects: from each replica's first attempt to its session
    /// opened, retries included, µs (the rest of the run for one never opened); under the
    /// handshake flood, each new replica's connection, session and first poll answered.
    opens: Vec<u64>,
    /// Writes of the dispatcher's Lease that were not accepted (conflicts, failures, timeouts);
    /// `None` from a dispatcher that does not count them.
    renewals_missed: Option<u64>,
}

/// The identities and objects every run uses.
struct Fixture {
    legit_ns: TestNamespace,
    hog_ns: TestNamespace,
    storm_ns: TestNamespace,
    legit: Credentials,
    hog: Credentials,
    /// A token of the storm's identity per replica, as each pod has its own.
    storm: Vec<Credentials>,
    ca: PathBuf,
}

/// What the plan measured: the Markdown table, and the JSON of `hostile --json`.
#[derive(Debug, Serialize)]
pub(crate) struct Results {
    /// Runs of each attack.
    repeats: usize,
    /// Timed writes per run.
    writes: usize,
    /// Every attack of the table, the baseline first.
    attacks: Vec<Figures>,
}

/// One attack's figures: medians over its runs (`null` in the JSON for none), but `lost`.
#[derive(Debug, Serialize)]
struct Figures {
    /// none, idle_admin, health_streams, junk_tokens, connections, body_hog, reconnect_storm
    /// or handshake_flood.
    attack: Attack,
    /// Write to reconcile, p50 of each run, ms.
    p50_ms: f64,
    /// Write to reconcile, p99 of each run, ms.
    p99_ms: f64,
    /// `p99_ms` divided by the baseline's.
    p99_over_baseline: f64,
    /// From the API server's answer to the write to its hand-over, p99 of each run, ms: the
    /// write-to-reconcile time without the write's own round trip.
    after_answer_p99_ms: f64,
    /// Writes not handed over within 10 s, summed over the runs.
    lost: usize,
    /// `/healthz` answer time, p99 of each run, ms.
    healthz_p99_ms: f64,
    /// The dispatcher's peak RSS, MiB.
    peak_rss_mib: f64,
    /// Calls or connections the attack made per run.
    attempts: f64,
    /// Of those, refused or closed.
    refused: f64,
    /// The reconnect storm's OpenSession answer time, p50 of each run, ms (`null` for the other
    /// attacks).
    open_p50_ms: Option<f64>,
    /// Its p99 of each run, ms.
    open_p99_ms: Option<f64>,
    /// Its slowest over every run, ms (10 000 for one that failed or took longer).
    open_max_ms: Option<f64>,
    /// Writes of the dispatcher's Lease not accepted, summed over the runs (`null` from a
    /// dispatcher that does not count them).
    renewals_missed: Option<u64>,
}

/// Runs the plan and returns what it measured.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<Results> {
    let cluster = Cluster::shared();
    let ca = cluster.dir().join("pki/ca.crt");
    let legit_ns = TestNamespace::create("bench-hostile").await?;
    let hog_ns = TestNamespace::create("bench-hostile-hog").await?;
    let storm_ns = TestNamespace::create("bench-hostile-storm").await?;
    account(&legit_ns, "legit", &["list", "watch"]).await?;
    account(&hog_ns, "hog", &["list", "watch"]).await?;
    account(&storm_ns, "storm", &["list", "watch"]).await?;
    let legit = Credentials::tls(&ca).with_token(token(&legit_ns, "legit", "kube-dispatch").await?);
    let hog = Credentials::tls(&ca).with_token(token(&hog_ns, "hog", "kube-dispatch").await?);
    let storm = storm::storm_tokens(&storm_ns, &ca).await?;
    storm::storm_objects(&Api::namespaced(storm_ns.client(), storm_ns.name())).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(legit_ns.client(), legit_ns.name());
    super::objects::create_probe(&configmaps, "probe").await?;
    let fixture = Fixture {
        legit_ns,
        hog_ns,
        storm_ns,
        legit,
        hog,
        storm,
        ca,
    };
    std::fs::create_dir_all(&plan.logs)?;
    // The attackers run on threads of their own, as they would be pods of their own.
    let attackers = kube_dispatch_tests::flood::Attackers::start()?;
    let mut runs: Vec<(Attack, Run)> = Vec::new();
    for repeat in 0..plan.repeats {
        // Rotated, so drift on a noisy machine falls on every attack.
        let mut order = plan.attacks.clone();
        let turn = repeat % order.len();
        order.rotate_left(turn);
        for attack in order {
            let run = one_run(&plan, &fixture, attack, repeat, attackers.handle()).await?;
            println!(
                "bench-hostile: run {} {:<32} write to reconcile p50 {:>7.2} ms p99 {:>7.2} ms, lost {}, /healthz p99 {:>6.1} ms, peak RSS {:>6.1} MiB, attack {} made, {} refused",
                repeat + 1,
                attack.name(),
                ms(&run.deliveries, 0.5),
                ms(&run.deliveries, 0.99),
                run.lost,
                ms(&run.probes, 0.99),
                mib(run.peak_rss),
                run.attempts,
                run.refused,
            );
            runs.push((attack, run));
        }
    }
    Ok(Results::of(&plan, &runs))
}

fn ms(values: &[u64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    percentile(&sorted, p).unwrap_or(f64::NAN) / 1e3
}

#[allow(clippy::cast_precision_loss)]
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A dispatcher process with security on, and where it listens.
struct Dispatcher {
    process: Component,
    grpc: SocketAddr,
    admin: SocketAddr,
}

async fn start_dispatcher(plan: &Plan, name: &str, leases: &str) -> anyhow::Result<Dispatcher> {
    let cluster = Cluster::shared();
    let pki = cluster.dir().join("pki");
    let free = |_| -> anyhow::Result<SocketAddr> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        Ok(listener.local_addr()?)
    };
    let (grpc, admin) = (free(0)?, free(1)?);
    let env = [
        ("KUBECONFIG", cluster.kubeconfig().display().to_string()),
        ("KD_DISPATCHER_ID", "dispatcher-0".to_owned()),
        ("KD_LEASE_NAMESPACE", leases.to_owned()),
        ("KD_ADVERTISE_ADDRESS", grpc.to_string()),
        ("KD_LISTEN", grpc.to_string()),
        ("KD_ADMIN_LISTEN", admin.to_string()),
        ("KD_RESYNC_INTERVAL", "0s".to_owned()),
        ("KD_LOG_JSON", "1".to_owned()),
        (
            "KD_TLS_CERT_FILE",
            pki.join("kube-dispatch.crt").display().to_string(),
        ),
        (
            "KD_TLS_KEY_FILE",
            pki.join("kube-dispatch.key").display().to_string(),
        ),
        ("KD_MAX_BODY_BYTES", BODY_POOL.to_string()),
        // What it would verify and send when calling peers (a ring of one has none).
        ("KD_TLS_CA_FILE", pki.join("ca.crt").display().to_string()),
        (
            "KD_TOKEN_FILE",
            cluster
                .dir()
                .join("tokens/tester.token")
                .display()
                .to_string(),
        ),
    ];
    let mut process = Component::spawn(name, &plan.dispatcher, &[], &env, &plan.logs, None)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_status(admin, "/readyz", Duration::from_secs(1)).await != Some(200) {
        process.ensure_running()?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the dispatcher was not ready within 30 s; see {}",
            process.log.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Dispatcher {
        process,
        grpc,
        admin,
    })
}

async fn one_run(
    plan: &Plan,
    fixture: &Fixture,
    attack: Attack,
    repeat: usize,
    on: &tokio::runtime::Handle,
) -> anyhow::Result<Run> {
    let name = format!("hostile-{}-{repeat}", format!("{attack:?}").to_lowercase());
    // Leases of its own: the run ends by killing the dispatcher, whose Lease the next one
    // would otherwise find unreleased and wait out.
    let leases = TestNamespace::create("bench-hostile-leases").await?;
    let mut d = start_dispatcher(plan, &name, leases.name()).await?;
    let endpoint = |c: &Credentials| -> anyhow::Result<tonic::transport::Endpoint> {
        Ok(c.endpoint(&d.grpc.to_string())?)
    };
    let channel = endpoint(&fixture.legit)?.connect().await?;
    let client = DispatcherClient::with_interceptor(channel, fixture.legit.bearer());
    let mut session = TestSession::open_with(
        client,
        "legit",
        "legit-0",
        vec![subscription("v1", "ConfigMap", fixture.legit_ns.name())],
    )
    .await
    .context("the legitimate controller's OpenSession")?;
    let mut acks = first_list(&mut session).await?;

    let stop = CancellationToken::new();
    let attempts = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut attackers = JoinSet::new();
    let counters = (attempts.clone(), refused.clone());
    let opens: Opens = Arc::default();
    launch(
        attack,
        fixture,
        &d,
        &stop,
        counters,
        &opens,
        (&mut attackers, on),
    )
    .await?;
    tokio::time::sleep(attack.warmup()).await;
    let probes = tokio::spawn(probe(d.admin, stop.clone()));

    let configmaps: Api<ConfigMap> =
        Api::namespaced(fixture.legit_ns.client(), fixture.legit_ns.name());
    let mut run = Run::default();
    let mut pace = tokio::time::interval(attack.write_spacing());
    for n in 0..plan.writes {
        pace.tick().await;
        let value = format!("{repeat}-{n}");
        match timed_write(&configmaps, &mut session, &mut acks, &value, LOST_AFTER)
            .await
            .context("the legitimate controller")?
        {
            Some(timed) => {
                run.deliveries.push(micros(timed.took));
                run.after_answers
                    .push(micros(timed.took.saturating_sub(timed.answered)));
            }
            None => run.lost += 1,
        }
    }
    session.ack(&acks).await?;
    run.peak_rss = d.process.usage()?.peak_rss;
    stop.cancel();
    run.probes = probes.await?;
    while let Some(done) = attackers.join_next().await {
        done??;
    }
    run.attempts = attempts.load(Ordering::Relaxed);
    run.refused = refused.load(Ordering::Relaxed);
    run.opens = std::mem::take(&mut *opens.lock().unwrap_or_else(|e| e.into_inner()));
    run.renewals_missed = renewals_missed(d.admin).await?;
    d.process.kill().await;
    Ok(run)
}

/// The writes of the dispatcher's Lease it counts as not accepted
/// (`kube_dispatch_lease_renewals_total` but `accepted`); `None` if it counts none accepted (a
/// dispatcher before the counter).
async fn renewals_missed(admin: SocketAddr) -> anyhow::Result<Option<u64>> {
    let text = String::from_utf8_lossy(&super::admin::scrape(admin).await?).into_owned();
    let all = counter_sum(&text, "kube_dispatch_lease_renewals_total");
    let accepted: f64 = text
        .lines()
        .filter(|l| l.starts_with(r#"kube_dispatch_lease_renewals_total{outcome="accepted"}"#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok((accepted > 0.0).then_some((all - accepted) as u64))
}

/// Asks `/healthz` every 100 ms until `stop`; each answer's time, 1 s for none.
async fn probe(admin: SocketAddr, stop: CancellationToken) -> Vec<u64> {
    let mut times = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !stop.is_cancelled() {
        tick.tick().await;
        let begun = Instant::now();
        let answered = http_status(admin, "/healthz", Duration::from_secs(1)).await == Some(200);
        times.push(if answered {
            micros(begun.elapsed())
        } else {
            1_000_000
        });
    }
    times
}
