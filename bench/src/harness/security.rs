//! `make bench-security` (`kube-dispatch-bench security`): what TLS, TokenReview and
//! SubjectAccessReview cost.
//!
//! One dispatcher in this process (on a runtime of its own), against the local control plane,
//! run with security off (plaintext, anonymous) and on (TLS, ServiceAccount tokens), in
//! alternating order `--repeats` times each:
//!
//! - **OpenSession latency**: sessions opened one after another, each in a group of its own
//!   (so each starts a watch, as a new controller does); with security on, the first one also
//!   pays the first TokenReview and SubjectAccessReviews, shown apart.
//! - **write to delivery**: a ConfigMap patched `--writes` times, one at a time; each time
//!   from sending the patch to the poll that hands the change to the session.
//! - **reviews under load** (security on): `--sessions` sessions of `--identities`
//!   ServiceAccounts polling for `--window`; the TokenReviews
//!   and SubjectAccessReviews the API server counted in that window (its `/metrics`), against
//!   the polls made.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Client,
    api::{Api, Patch, PatchParams},
};
use kube_dispatch_proto::{
    credentials::Credentials,
    v1::{OpenSessionRequest, dispatcher_client::DispatcherClient},
};
use kube_dispatch_server::tls::Transport;
use kube_dispatch_tests::{
    Cluster, TestNamespace,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
    identity::{account, token},
};
use serde::Serialize;

use super::{
    apiserver::request_counts,
    report::{alternate, median, percentile},
};

/// What to run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// Runs of each mode.
    pub repeats: usize,
    /// Timed writes per run.
    pub writes: usize,
    /// Sessions opened and timed per run.
    pub opens: usize,
    /// Sessions polling in the review window.
    pub sessions: usize,
    /// Identities they belong to.
    pub identities: usize,
    /// How long they poll.
    pub window: Duration,
}

/// One run of one mode.
#[derive(Debug, Default)]
struct Run {
    /// The first OpenSession of the run, ms.
    first_open: f64,
    /// The others, µs.
    opens: Vec<u64>,
    /// Write to delivery, µs.
    deliveries: Vec<u64>,
}

/// Figures of the review window.
#[derive(Debug)]
struct Load {
    polls: u64,
    token_reviews: u64,
    access_reviews: u64,
    window: Duration,
}

/// What the plan measured: the Markdown table, and the JSON of `security --json`.
#[derive(Debug)]
pub(crate) struct Results {
    plan: Plan,
    off: Vec<Run>,
    on: Vec<Run>,
    load: Load,
}

/// A figure of one run, in ms.
type Figure = fn(&Run) -> f64;

/// The rows of the latency table: JSON key, Markdown label, figure of a run.
const ROWS: [(&str, &str, Figure); 5] = [
    (
        "write_to_delivery_p50_ms",
        "write to delivery, p50 (ms)",
        |r| percentile_ms(&r.deliveries, 0.5, 1e3),
    ),
    (
        "write_to_delivery_p99_ms",
        "write to delivery, p99 (ms)",
        |r| percentile_ms(&r.deliveries, 0.99, 1e3),
    ),
    ("open_session_p50_ms", "OpenSession, p50 (ms)", |r| {
        percentile_ms(&r.opens, 0.5, 1e3)
    }),
    ("open_session_p99_ms", "OpenSession, p99 (ms)", |r| {
        percentile_ms(&r.opens, 0.99, 1e3)
    }),
    (
        "first_open_session_ms",
        "first OpenSession of a run (ms)",
        |r| r.first_open,
    ),
];

/// The JSON of `security --json`.
#[derive(Debug, Serialize)]
pub(crate) struct Figures {
    /// Runs of each mode.
    repeats: usize,
    /// Timed writes per run.
    writes: usize,
    /// Sessions opened and timed per run.
    opens: usize,
    /// Security off: row key to the median over the runs, ms (`null` for none).
    off: BTreeMap<&'static str, f64>,
    /// Security on, the same.
    on: BTreeMap<&'static str, f64>,
    /// The review window, security on.
    load: LoadFigures,
}

/// The review window in the JSON: what polled, and the reviews per minute.
#[derive(Debug, Serialize)]
struct LoadFigures {
    sessions: usize,
    identities: usize,
    window_s: f64,
    polls_per_minute: f64,
    token_reviews_per_minute: f64,
    subject_access_reviews_per_minute: f64,
}

/// Runs the plan and returns what it measured.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<Results> {
    let cluster = Cluster::shared();
    let client = cluster.client().await?;
    let ns = TestNamespace::create("bench-security").await?;
    let identities = plan.identities.max(1);
    for i in 0..identities {
        account(&ns, &format!("controller-{i}"), &["list", "watch"]).await?;
    }
    let mut tokens = Vec::new();
    for i in 0..identities {
        tokens.push(token(&ns, &format!("controller-{i}"), "kube-dispatch").await?);
    }
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    super::objects::create_probe(&configmaps, "probe").await?;

    let mut off = Vec::new();
    let mut on = Vec::new();
    for repeat in 0..plan.repeats {
        for secure in alternate(repeat) {
            let run = latency_run(&plan, &ns, &configmaps, secure, &tokens[0]).await?;
            println!(
                "bench-security: run {} security {:<3}: first OpenSession {:>6.1} ms, OpenSession p50 {:>6.1} ms, write to delivery p50 {:>6.2} ms p99 {:>6.2} ms",
                repeat + 1,
                if secure { "on" } else { "off" },
                run.first_open,
                percentile_ms(&run.opens, 0.5, 1e3),
                percentile_ms(&run.deliveries, 0.5, 1e3),
                percentile_ms(&run.deliveries, 0.99, 1e3),
            );
            if secure { &mut on } else { &mut off }.push(run);
        }
    }
    let load = load_run(&plan, &client, &ns, &tokens).await?;
    println!(
        "bench-security: {} sessions of {} identities for {:?}: {} polls, {} TokenReviews, {} SubjectAccessReviews",
        plan.sessions, identities, load.window, load.polls, load.token_reviews, load.access_reviews
    );
    Ok(Results {
        plan,
        off,
        on,
        load,
    })
}

fn percentile_ms(values: &[u64], p: f64, per_ms: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    percentile(&sorted, p).unwrap_or(f64::NAN) / per_ms
}

/// Starts a dispatcher with security on or off and the credentials to call it.
async fn dispatcher(secure: bool, token: &str) -> anyhow::Result<(TestDispatcher, Credentials)> {
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    let credentials = if secure {
        Credentials::tls(Cluster::shared().dir().join("pki/ca.crt")).with_token(token)
    } else {
        config.security.transport = Transport::Plaintext;
        config.security.authentication = None;
        Credentials::plaintext()
    };
    // Enough room for every session of the load run.
    config.settings.limits.max_sessions_per_group = 100_000;
    config.settings.limits.max_sessions_per_identity = 100_000;
    config.settings.limits.max_groups_per_identity = 100_000;
    let d = TestDispatcher::start(config).await?;
    Ok((d, credentials))
}

async fn open(
    client: &mut DispatcherClient<kube_dispatch_proto::credentials::AuthChannel>,
    group: &str,
    replica: &str,
    ns: &str,
) -> anyhow::Result<String> {
    Ok(client
        .open_session(OpenSessionRequest {
            group: group.into(),
            replica_id: replica.into(),
            subscriptions: vec![subscription("v1", "ConfigMap", ns)],
            ttl: None,
            ..Default::default()
        })
        .await
        .with_context(|| format!("OpenSession of {group}/{replica}"))?
        .into_inner()
        .session_id)
}

async fn latency_run(
    plan: &Plan,
    ns: &TestNamespace,
    configmaps: &Api<ConfigMap>,
    secure: bool,
    token: &str,
) -> anyhow::Result<Run> {
    let (d, credentials) = dispatcher(secure, token).await?;
    let mut client = d.client_as(&credentials).await;
    let mut run = Run::default();
    for i in 0..plan.opens.max(2) {
        let begun = Instant::now();
        open(&mut client, &format!("open-{i}"), "replica-0", ns.name()).await?;
        let took = begun.elapsed();
        if i == 0 {
            run.first_open = took.as_secs_f64() * 1e3;
        } else {
            #[allow(clippy::cast_possible_truncation)]
            run.opens.push(took.as_micros() as u64);
        }
    }
    let id = open(&mut client, "latency", "replica-0", ns.name()).await?;
    let mut session = TestSession { client, id };
    let mut acks = first_list(&mut session).await?;
    for n in 0..plan.writes {
        let delivered = timed_write(
            configmaps,
            &mut session,
            &mut acks,
            &n.to_string(),
            Duration::from_secs(30),
        )
        .await?;
        let took = delivered
            .with_context(|| format!("write {n} was never delivered"))?
            .took;
        #[allow(clippy::cast_possible_truncation)]
        run.deliveries.push(took.as_micros() as u64);
    }
    session.ack(&acks).await?;
    d.stop().await;
    Ok(run)
}

/// Takes what a new session is handed for its first list (the probe, once): the acks to send.
pub(crate) async fn first_list(session: &mut TestSession) -> anyhow::Result<Vec<u64>> {
    Ok(session
        .hold(Duration::from_secs(30))
        .await?
        .iter()
        .map(|r| r.delivery_id)
        .collect())
}

/// One timed write: from sending the patch to the poll that handed the change over, and of that
/// how long the API server took to answer the patch (the rest is the watch's and the tier's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timed {
    /// From the patch to the hand-over.
    pub(crate) took: Duration,
    /// From the patch to its answer.
    pub(crate) answered: Duration,
}

/// Patches the ConfigMap `probe` to `value` and polls `session` (acknowledging `acks`, which it
/// leaves holding the last deliveries) until the change is handed over: how long that took, or
/// `None` when it was not handed over within `give_up`.
pub(crate) async fn timed_write(
    configmaps: &Api<ConfigMap>,
    session: &mut TestSession,
    acks: &mut Vec<u64>,
    value: &str,
    give_up: Duration,
) -> anyhow::Result<Option<Timed>> {
    let begun = Instant::now();
    configmaps
        .patch(
            "probe",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"n": value}})),
        )
        .await?;
    let answered = begun.elapsed();
    loop {
        let got = session
            .poll_acking(acks, Duration::from_secs(1).min(give_up))
            .await
            .context("poll")?;
        *acks = got.iter().map(|r| r.delivery_id).collect();
        if !got.is_empty() {
            return Ok(Some(Timed {
                took: begun.elapsed(),
                answered,
            }));
        }
        if begun.elapsed() >= give_up {
            return Ok(None);
        }
    }
}

async fn load_run(
    plan: &Plan,
    client: &Client,
    ns: &TestNamespace,
    tokens: &[String],
) -> anyhow::Result<Load> {
    let (d, _) = dispatcher(true, &tokens[0]).await?;
    let polls = Arc::new(AtomicU64::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    let per_identity = plan.sessions.div_ceil(tokens.len());
    for (i, token) in tokens.iter().enumerate() {
        let credentials =
            Credentials::tls(Cluster::shared().dir().join("pki/ca.crt")).with_token(token);
        // One connection per identity, as one replica process multiplexes its sessions.
        let mut client = d.client_as(&credentials).await;
        for r in 0..per_identity.min(plan.sessions - i * per_identity) {
            let id = open(
                &mut client,
                &format!("load-{i}"),
                &format!("replica-{r}"),
                ns.name(),
            )
            .await?;
            let mut session = TestSession {
                client: client.clone(),
                id,
            };
            let (polls, stop) = (polls.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut acks: Vec<u64> = Vec::new();
                while !stop.is_cancelled() {
                    match session.poll_acking(&acks, Duration::from_secs(1)).await {
                        Ok(got) => acks = got.iter().map(|r| r.delivery_id).collect(),
                        Err(status) => return Err(status),
                    }
                    polls.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }));
        }
    }
    // Count from when every session polls: the reviews of opening are not the steady state.
    let before = request_counts(client).await?;
    let polls_before = polls.load(Ordering::Relaxed);
    let begun = Instant::now();
    tokio::time::sleep(plan.window).await;
    let after = request_counts(client).await?;
    let window = begun.elapsed();
    let polled = polls.load(Ordering::Relaxed) - polls_before;
    stop.cancel();
    for task in tasks {
        task.await?.context("a session's poll failed")?;
    }
    d.stop().await;
    Ok(Load {
        polls: polled,
        token_reviews: after.since(&before, "tokenreviews", "POST"),
        access_reviews: after.since(&before, "subjectaccessreviews", "POST"),
        window,
    })
}

impl Results {
    /// The median over the runs of one mode of a row's figure; NaN for no runs.
    fn per_run(runs: &[Run], f: Figure) -> f64 {
        median(runs.iter().map(f).collect()).unwrap_or(f64::NAN)
    }

    /// The review window's counts per minute: polls, TokenReviews, SubjectAccessReviews.
    fn per_minute(&self) -> (f64, f64, f64) {
        let minutes = self.load.window.as_secs_f64() / 60.0;
        (
            self.load.polls as f64 / minutes,
            self.load.token_reviews as f64 / minutes,
            self.load.access_reviews as f64 / minutes,
        )
    }

    /// The results as Markdown: the latency table, off against on, then the review window.
    pub(crate) fn table(&self) -> String {
        use std::fmt::Write as _;

        let (plan, load) = (&self.plan, &self.load);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| figure (median of {} runs each) | security off | security on | on - off | on / off |\n| --- | ---: | ---: | ---: | ---: |",
            plan.repeats
        );
        for (_, label, f) in ROWS {
            let (a, b) = (Self::per_run(&self.off, f), Self::per_run(&self.on, f));
            let _ = writeln!(
                out,
                "| {label} | {a:.2} | {b:.2} | {:+.2} | {:.2}x |",
                b - a,
                b / a
            );
        }
        let (polls, token_reviews, access_reviews) = self.per_minute();
        let _ = writeln!(
            out,
            "\nReviews under load, security on: {} sessions of {} ServiceAccounts polling (1 s long polls) for {:.0} s:\n\n| per minute | count |\n| --- | ---: |\n| polls | {:.0} |\n| TokenReviews | {:.1} |\n| SubjectAccessReviews | {:.1} |\n",
            plan.sessions,
            plan.identities,
            load.window.as_secs_f64(),
            polls,
            token_reviews,
            access_reviews,
        );
        out
    }

    /// The figures of the table, for the JSON.
    pub(crate) fn figures(&self) -> Figures {
        let mode = |runs: &[Run]| -> BTreeMap<&'static str, f64> {
            ROWS.iter()
                .map(|(key, _, f)| (*key, Self::per_run(runs, *f)))
                .collect()
        };
        let (polls, token_reviews, access_reviews) = self.per_minute();
        Figures {
            repeats: self.plan.repeats,
            writes: self.plan.writes,
            opens: self.plan.opens,
            off: mode(&self.off),
            on: mode(&self.on),
            load: LoadFigures {
                sessions: self.plan.sessions,
                identities: self.plan.identities,
                window_s: self.load.window.as_secs_f64(),
                polls_per_minute: polls,
                token_reviews_per_minute: token_reviews,
                subject_access_reviews_per_minute: access_reviews,
            },
        }
    }
}
