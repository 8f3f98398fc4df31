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
use base64::Engine as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube_dispatch_proto::{
    credentials::Credentials,
    v1::{PollRequest, dispatcher_client::DispatcherClient},
};
use kube_dispatch_tests::{
    Cluster, TestNamespace,
    dispatcher::{TestSession, subscription},
    identity::{account, token},
};
use serde::{Serialize, Serializer};
use tokio::{io::AsyncWriteExt, net::TcpStream, task::JoinSet};
use tokio_util::sync::CancellationToken;

use super::{
    admin::http_status,
    process::Component,
    report::{median, percentile},
    security::{first_list, timed_write},
};

/// The body pool the benchmark's dispatcher runs with: small enough that the body hog fills it.
const BODY_POOL: usize = 32 * 1024 * 1024;
/// A write not handed over within this long is counted lost.
const LOST_AFTER: Duration = Duration::from_secs(10);

/// One attack of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attack {
    None,
    IdleAdmin,
    HealthStreams,
    JunkTokens,
    Connections,
    BodyHog,
}

impl Attack {
    pub(crate) const ALL: [Self; 6] = [
        Self::None,
        Self::IdleAdmin,
        Self::HealthStreams,
        Self::JunkTokens,
        Self::Connections,
        Self::BodyHog,
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
        }
    }

    fn bound(self) -> &'static str {
        match self {
            Self::None => "",
            Self::IdleAdmin => "1024 admin connections, 64 per peer, 2 s for a request head",
            Self::HealthStreams => "64 calls without a credential",
            Self::JunkTokens => "hopeless tokens unreviewed; 1 review/s per failing peer",
            Self::Connections => "128 connections per peer, 10 s to speak",
            Self::BodyHog => "body pool shared evenly per user (32 MiB here)",
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
    /// Writes not handed over within [`LOST_AFTER`].
    lost: usize,
    /// `/healthz` answer times, µs; a probe with no answer within 1 s counts as 1 s.
    probes: Vec<u64>,
    /// The dispatcher's peak RSS, bytes.
    peak_rss: u64,
    /// What the attack did: calls or connections made, refused.
    attempts: u64,
    refused: u64,
}

/// The identities and objects every run uses.
struct Fixture {
    legit_ns: TestNamespace,
    hog_ns: TestNamespace,
    legit: Credentials,
    hog: Credentials,
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
    /// none, idle_admin, health_streams, junk_tokens, connections or body_hog.
    attack: Attack,
    /// Write to reconcile, p50 of each run, ms.
    p50_ms: f64,
    /// Write to reconcile, p99 of each run, ms.
    p99_ms: f64,
    /// `p99_ms` divided by the baseline's.
    p99_over_baseline: f64,
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
}

/// Runs the plan and returns what it measured.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<Results> {
    let cluster = Cluster::shared();
    let ca = cluster.dir().join("pki/ca.crt");
    let legit_ns = TestNamespace::create("bench-hostile").await?;
    let hog_ns = TestNamespace::create("bench-hostile-hog").await?;
    account(&legit_ns, "legit", &["list", "watch"]).await?;
    account(&hog_ns, "hog", &["list", "watch"]).await?;
    let legit = Credentials::tls(&ca).with_token(token(&legit_ns, "legit", "kube-dispatch").await?);
    let hog = Credentials::tls(&ca).with_token(token(&hog_ns, "hog", "kube-dispatch").await?);
    let configmaps: Api<ConfigMap> = Api::namespaced(legit_ns.client(), legit_ns.name());
    super::objects::create_probe(&configmaps, "probe").await?;
    let fixture = Fixture {
        legit_ns,
        hog_ns,
        legit,
        hog,
        ca,
    };
    std::fs::create_dir_all(&plan.logs)?;
    let mut runs: Vec<(Attack, Run)> = Vec::new();
    for repeat in 0..plan.repeats {
        // Rotated, so drift on a noisy machine falls on every attack.
        let mut order = Attack::ALL;
        order.rotate_left(repeat % Attack::ALL.len());
        for attack in order {
            let run = one_run(&plan, &fixture, attack, repeat).await?;
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

async fn start_dispatcher(
    plan: &Plan,
    fixture: &Fixture,
    name: &str,
) -> anyhow::Result<Dispatcher> {
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
        ("KD_RING_MEMBERS", "dispatcher-0".to_owned()),
        ("KD_LEASE_NAMESPACE", fixture.legit_ns.name().to_owned()),
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
) -> anyhow::Result<Run> {
    let name = format!("hostile-{}-{repeat}", format!("{attack:?}").to_lowercase());
    let mut d = start_dispatcher(plan, fixture, &name).await?;
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
    match attack {
        Attack::None => {}
        Attack::IdleAdmin => {
            attackers.spawn(idle_admin(d.admin, stop.clone(), counters));
        }
        Attack::HealthStreams => {
            attackers.spawn(health_streams(
                endpoint(&Credentials::tls(&fixture.ca))?,
                stop.clone(),
                counters,
            ));
        }
        Attack::JunkTokens => {
            attackers.spawn(junk_tokens(
                endpoint(&Credentials::tls(&fixture.ca))?,
                stop.clone(),
                counters,
            ));
        }
        Attack::Connections => {
            attackers.spawn(connections(
                endpoint(&Credentials::tls(&fixture.ca))?,
                stop.clone(),
                counters,
            ));
        }
        Attack::BodyHog => {
            let channel = endpoint(&fixture.hog)?.connect().await?;
            let client = DispatcherClient::with_interceptor(channel, fixture.hog.bearer());
            let hog = TestSession::open_with(
                client,
                "hog",
                "hog-0",
                vec![subscription("v1", "ConfigMap", fixture.hog_ns.name())],
            )
            .await
            .context("the hog's OpenSession")?;
            let api: Api<ConfigMap> =
                Api::namespaced(fixture.hog_ns.client(), fixture.hog_ns.name());
            attackers.spawn(body_hog(api, hog, stop.clone(), counters));
        }
    }
    // Let the attack reach its bound before measuring.
    if attack != Attack::None {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let probes = tokio::spawn(probe(d.admin, stop.clone()));

    let configmaps: Api<ConfigMap> =
        Api::namespaced(fixture.legit_ns.client(), fixture.legit_ns.name());
    let mut run = Run::default();
    for n in 0..plan.writes {
        let value = format!("{repeat}-{n}");
        match timed_write(&configmaps, &mut session, &mut acks, &value, LOST_AFTER)
            .await
            .context("the legitimate controller")?
        {
            Some(took) => run.deliveries.push(micros(took)),
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
    d.process.kill().await;
    Ok(run)
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

type Counters = (Arc<AtomicU64>, Arc<AtomicU64>);

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

/// Another tenant's group over 40 ConfigMaps of 1000 KiB, rewritten one after another all
/// along; its session is kept alive with empty acks and never polls.
async fn body_hog(
    api: Api<ConfigMap>,
    mut hog: TestSession,
    stop: CancellationToken,
    (attempts, _refused): Counters,
) -> anyhow::Result<()> {
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

impl Results {
    /// Medians over the repeats of each attack's runs.
    fn of(plan: &Plan, runs: &[(Attack, Run)]) -> Self {
        let of = |attack: Attack| -> Vec<&Run> {
            runs.iter()
                .filter(|(a, _)| *a == attack)
                .map(|(_, r)| r)
                .collect()
        };
        let med = |rs: &[&Run], f: &dyn Fn(&Run) -> f64| {
            median(rs.iter().map(|r| f(r)).collect()).unwrap_or(f64::NAN)
        };
        let baseline_p99 = med(&of(Attack::None), &|r| ms(&r.deliveries, 0.99));
        let attacks: Vec<Figures> = Attack::ALL
            .into_iter()
            .map(|attack| {
                let rs = of(attack);
                let p99 = med(&rs, &|r| ms(&r.deliveries, 0.99));
                Figures {
                    attack,
                    p50_ms: med(&rs, &|r| ms(&r.deliveries, 0.5)),
                    p99_ms: p99,
                    p99_over_baseline: p99 / baseline_p99,
                    lost: rs.iter().map(|r| r.lost).sum::<usize>(),
                    healthz_p99_ms: med(&rs, &|r| ms(&r.probes, 0.99)),
                    peak_rss_mib: med(&rs, &|r| mib(r.peak_rss)),
                    attempts: med(&rs, &|r| r.attempts as f64),
                    refused: med(&rs, &|r| r.refused as f64),
                }
            })
            .collect();
        Self {
            repeats: plan.repeats,
            writes: plan.writes,
            attacks,
        }
    }

    /// The results as Markdown: a row per attack.
    pub(crate) fn table(&self) -> String {
        use std::fmt::Write as _;

        let mut out = String::new();
        let _ = writeln!(
            out,
            "| attack (median of {} runs, {} writes each) | bound that holds it | write to reconcile p50 (ms) | p99 (ms) | p99 / baseline | lost | `/healthz` p99 (ms) | dispatcher peak RSS (MiB) | attack calls or connections | refused or closed |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            self.repeats, self.writes
        );
        for f in &self.attacks {
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} | {:.2} | {:.2}x | {} | {:.1} | {:.1} | {:.0} | {:.0} |",
                f.attack.name(),
                f.attack.bound(),
                f.p50_ms,
                f.p99_ms,
                f.p99_over_baseline,
                f.lost,
                f.healthz_p99_ms,
                f.peak_rss_mib,
                f.attempts,
                f.refused,
            );
        }
        let _ = writeln!(
            out,
            "\n`lost` sums every run; the pod limit in `deploy/` is 512 MiB (this dispatcher's body pool is 32 MiB instead of 256 MiB, so the hog fills it within a run)."
        );
        out
    }
}
