//! `make bench-ceiling` (`kube-dispatch-bench ceiling`): how many watch events one dispatcher
//! absorbs per core.
//!
//! One dispatcher (it owns every key), the load balancer and one SDK replica of the benchmark
//! controller, on `--objects` ConfigMaps. A writer then patches the objects at rising rates,
//! each for `--window`, with up to [`WRITERS`] patches in flight; a tick that finds
//! every writer busy is dropped, so the rate achieved says when the writer (and the API server
//! behind it) stopped keeping up. Every patch changes the object, and so does the controller's
//! reconcile (it writes the content hash), so the dispatcher's watch sees about two events per
//! patch; it counts them itself (`kube_dispatch_watch_events_total`, scraped from its admin
//! port before and after each step).
//!
//! Per step: the rate achieved, the events the dispatcher saw per second, the CPU each process
//! used (seconds of CPU per second of the window: cores), and from that **events per
//! CPU-second of the dispatcher**: the rate one core of dispatcher absorbs (decoding the watch,
//! routing each event to its key's queue, and delivering the reconciles). Then write to
//! reconcile start, p50 and p99 and the worst, and how long after the writer stopped every
//! write had been reconciled: a dispatcher that falls behind shows it there first.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use kube_dispatch_bench::{ReconcileStart, now_micros};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::{
    admin::{counter_sum, scrape},
    apiserver::request_counts,
    objects::{Kind, change_value},
    process::Component,
    report::{as_millis, percentile},
    run::{Setup, Variant},
};

/// Patches in flight at once, at most.
pub(crate) const WRITERS: usize = 64;

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// Target write rates, writes per second, in the order run.
    pub rates: Vec<u32>,
    /// How long each rate is held.
    pub window: Duration,
}

/// The JSON of `ceiling --json`: every rate's figures, in the order run.
#[derive(Debug, Serialize)]
pub(crate) struct Figures<'a> {
    /// One per rate of the plan.
    pub(crate) steps: &'a [Step],
}

/// One rate's figures (a row of the table; in the JSON, under the names given).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Step {
    /// The target write rate, writes per second.
    target: u32,
    /// Writes completed per second of the window.
    achieved: f64,
    /// PATCH requests on ConfigMaps per second of the window: the writer's and the
    /// controller's.
    #[serde(rename = "patches_per_s")]
    patches: f64,
    /// Watch events the dispatcher counted per second of the window.
    #[serde(rename = "events_per_s")]
    events: f64,
    /// CPU seconds per second of the window.
    dispatcher_cores: f64,
    /// Events per CPU-second of the dispatcher: the rate one core of it absorbs.
    #[serde(rename = "events_per_dispatcher_cpu_s")]
    per_core: f64,
    replica_cores: f64,
    apiserver_cores: f64,
    etcd_cores: f64,
    /// Write to reconcile start, ms.
    #[serde(rename = "p50_ms")]
    p50: f64,
    #[serde(rename = "p99_ms")]
    p99: f64,
    #[serde(rename = "worst_ms")]
    worst: f64,
    /// From the writer stopping to every write reconciled.
    #[serde(rename = "caught_up_ms", serialize_with = "as_millis")]
    caught_up: Duration,
}

/// Reconcile starts seen, per key: (when, resourceVersion).
pub(crate) type Starts = HashMap<String, Vec<(u64, u64)>>;

/// Waits, for at most 60 s, until every write of `sent` (key, when it was sent, the
/// resourceVersion it made) has been seen by a reconcile start; returns each write's latency
/// from sending to that start, sorted, in microseconds.
pub(crate) async fn await_reconciled(
    starts: &mut watch::Receiver<Starts>,
    sent: &[(String, u64, u64)],
) -> anyhow::Result<Vec<u64>> {
    let reconciled = |s: &Starts, key: &str, rv: u64| {
        s.get(key)?
            .iter()
            .filter(|(_, r)| *r >= rv)
            .map(|(at, _)| *at)
            .min()
    };
    tokio::time::timeout(
        Duration::from_secs(60),
        starts.wait_for(|s| {
            sent.iter()
                .all(|(key, _, rv)| reconciled(s, key, *rv).is_some())
        }),
    )
    .await
    .context("some writes were not reconciled within 60 s")??;
    let s = starts.borrow();
    let mut latencies: Vec<u64> = sent
        .iter()
        .filter_map(|(key, at, rv)| Some(reconciled(&s, key, *rv)?.saturating_sub(*at)))
        .collect();
    latencies.sort_unstable();
    Ok(latencies)
}

async fn watch_events(admin: u16) -> anyhow::Result<f64> {
    let body = scrape(([127, 0, 0, 1], admin).into())
        .await
        .context("cannot scrape the dispatcher's /metrics")?;
    Ok(counter_sum(
        &String::from_utf8_lossy(&body),
        "kube_dispatch_watch_events_total",
    ))
}

impl Setup<'_> {
    /// Runs the plan on a tier of one dispatcher.
    pub(crate) async fn ceiling(&self, plan: &Plan) -> anyhow::Result<Vec<Step>> {
        anyhow::ensure!(
            self.kinds == [Kind::ConfigMap] && self.dispatchers == 1 && self.groups == 1,
            "the ceiling runs on ConfigMaps with one dispatcher and one controller"
        );
        let log_dir = self.log_dir.join(format!("ceiling-{}", self.objects));
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("cannot create {}", log_dir.display()))?;
        let tier = self.start_tier(&log_dir, None).await?;
        let (starts_tx, mut starts) = watch::channel(Starts::new());
        let (tx, mut rx) = mpsc::channel::<(usize, ReconcileStart)>(4096);
        let observer = tokio::spawn(async move {
            while let Some((_, start)) = rx.recv().await {
                starts_tx.send_modify(|s| {
                    s.entry(start.key)
                        .or_default()
                        .push((start.at_micros, start.resource_version));
                });
            }
        });
        let mut replicas =
            self.start_replicas(Variant::Dispatch(1), tier.lb_port, &log_dir, &tx)?;
        drop(tx);
        let mut components = tier.components;
        let result = async {
            let objects = self.objects;
            tokio::time::timeout(
                Duration::from_secs(120),
                starts.wait_for(|s| s.len() >= objects),
            )
            .await
            .context("not every object was reconciled within 120 s of the start")??;
            let mut steps = Vec::new();
            for (n, &rate) in plan.rates.iter().enumerate() {
                let step = self
                    .step(
                        rate,
                        n,
                        plan.window,
                        tier.dispatcher_admin[0],
                        &mut components,
                        &mut replicas,
                        &mut starts,
                    )
                    .await
                    .with_context(|| format!("at {rate} writes/s"))?;
                println!(
                    "bench-ceiling: {rate:>5} writes/s: {:>6.0} achieved, {:>6.0} events/s, dispatcher {:.2} cores ({:.0} events per CPU-second), API server {:.2} cores, p99 {:.1} ms, caught up {:.0} ms after the writer stopped",
                    step.achieved,
                    step.events,
                    step.dispatcher_cores,
                    step.per_core,
                    step.apiserver_cores,
                    step.p99,
                    step.caught_up.as_secs_f64() * 1e3,
                );
                steps.push(step);
            }
            anyhow::Ok(steps)
        }
        .await;
        observer.abort();
        futures::future::join_all(replicas.into_iter().chain(components).map(Component::kill))
            .await;
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn step(
        &self,
        rate: u32,
        n: usize,
        window: Duration,
        admin: u16,
        tier: &mut [Component],
        replicas: &mut [Component],
        starts: &mut watch::Receiver<Starts>,
    ) -> anyhow::Result<Step> {
        let cpu = |components: &mut [Component]| -> anyhow::Result<f64> {
            let mut sum = 0.0;
            for c in components {
                sum += c.usage()?.cpu_seconds;
            }
            Ok(sum)
        };
        let dispatcher_before = cpu(&mut tier[..1])?;
        let replica_before = cpu(replicas)?;
        let plane_before = self.control_plane.cpu_seconds();
        let events_before = watch_events(admin).await?;
        let requests_before = request_counts(self.client).await?;
        let began = Instant::now();

        let sent = self.write_at(rate, n, window, began).await?;
        let elapsed = began.elapsed().as_secs_f64();
        let stopped = Instant::now();
        let dispatcher_cpu = cpu(&mut tier[..1])? - dispatcher_before;
        let replica_cpu = cpu(replicas)? - replica_before;
        let plane = self.control_plane.cpu_seconds();
        let events = watch_events(admin).await? - events_before;
        let patches =
            request_counts(self.client)
                .await?
                .since(&requests_before, "configmaps", "PATCH");

        let sent: Vec<(String, u64, u64)> = sent
            .into_iter()
            .map(|(i, at, rv)| (self.key(i), at, rv))
            .collect();
        let latencies = await_reconciled(starts, &sent)
            .await
            .context("after the writer stopped")?;
        let caught_up = stopped.elapsed();
        let ms = |p: f64| percentile(&latencies, p).unwrap_or(0.0) / 1e3;
        let dispatcher_cores = dispatcher_cpu / elapsed;
        let events = events / elapsed;
        Ok(Step {
            target: rate,
            achieved: sent.len() as f64 / elapsed,
            patches: patches as f64 / elapsed,
            events,
            dispatcher_cores,
            per_core: if dispatcher_cores > 0.0 {
                events / dispatcher_cores
            } else {
                0.0
            },
            replica_cores: replica_cpu / elapsed,
            apiserver_cores: (plane.0 - plane_before.0) / elapsed,
            etcd_cores: (plane.1 - plane_before.1) / elapsed,
            p50: ms(0.50),
            p99: ms(0.99),
            worst: latencies.last().copied().unwrap_or(0) as f64 / 1e3,
            caught_up,
        })
    }

    /// Step `n`'s writes: `rate` a second from `began` until `window` has passed, each to the
    /// next object with a value no write had before; a tick with every writer busy is dropped.
    /// Each write made: (object, when in micros, the resourceVersion it made).
    async fn write_at(
        &self,
        rate: u32,
        n: usize,
        window: Duration,
        began: Instant,
    ) -> anyhow::Result<Vec<(usize, u64, u64)>> {
        let sent: Arc<Mutex<Vec<(usize, u64, u64)>>> = Arc::default();
        let (permits, work) = work_queue();
        let mut writers = Vec::new();
        for _ in 0..WRITERS {
            let work = work.clone();
            let sent = sent.clone();
            let client = self.client.clone();
            let namespace = self.namespace.to_owned();
            let nonce = self.nonce;
            let objects = self.objects;
            writers.push(tokio::spawn(async move {
                // Write `w` goes to object `w % objects`, with a value no write had before.
                while let Ok(w) = work.recv().await {
                    let i = w % objects;
                    let at = now_micros();
                    let rv = change_value(
                        &client,
                        Kind::ConfigMap,
                        &namespace,
                        i,
                        &format!("{nonce}-ceiling-{n}-{w}"),
                    )
                    .await?;
                    sent.lock()
                        .map_err(|_| anyhow::anyhow!("a writer panicked"))?
                        .push((i, at, rv));
                }
                anyhow::Ok(())
            }));
        }
        drop(work);
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut next = 0usize;
        while began.elapsed() < window {
            ticks.tick().await;
            if permits.try_send(next).is_ok() {
                next += 1;
            }
        }
        drop(permits);
        for w in writers {
            w.await.context("a writer panicked")??;
        }
        let sent = std::mem::take(
            &mut *sent
                .lock()
                .map_err(|_| anyhow::anyhow!("a writer panicked"))?,
        );
        Ok(sent)
    }
}

/// The objects to write, taken by many writers: room for one, so a tick that finds the last
/// one not taken yet (every writer busy) is dropped.
fn work_queue() -> (mpsc::Sender<usize>, Shared) {
    let (tx, rx) = mpsc::channel(1);
    (tx, Shared(Arc::new(tokio::sync::Mutex::new(rx))))
}

/// The receiving end of [`work_queue`], shared by the writers.
#[derive(Clone)]
struct Shared(Arc<tokio::sync::Mutex<mpsc::Receiver<usize>>>);

impl Shared {
    async fn recv(&self) -> Result<usize, ()> {
        self.0.lock().await.recv().await.ok_or(())
    }
}

/// The results as Markdown.
pub(crate) fn table(steps: &[Step]) -> String {
    let mut out = String::from(
        "| target writes/s | achieved writes/s | PATCH/s, writer and controller (API server) | watch events/s (dispatcher) | dispatcher cores | events per dispatcher CPU-second | replica cores | kube-apiserver cores | etcd cores | write to reconcile p50 / p99 / worst (ms) | all reconciled after the writer stopped (ms) |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for s in steps {
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} / {:.1} / {:.1} | {:.0} |\n",
            s.target,
            s.achieved,
            s.patches,
            s.events,
            s.dispatcher_cores,
            s.per_core,
            s.replica_cores,
            s.apiserver_cores,
            s.etcd_cores,
            s.p50,
            s.p99,
            s.worst,
            s.caught_up.as_secs_f64() * 1e3,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_serializes_under_its_json_names() {
        let step = Step {
            target: 20,
            achieved: 19.5,
            patches: 40.0,
            events: 39.0,
            dispatcher_cores: 0.1,
            per_core: 390.0,
            replica_cores: 0.05,
            apiserver_cores: 0.5,
            etcd_cores: 0.1,
            p50: 1.0,
            p99: 2.0,
            worst: 3.0,
            caught_up: Duration::from_millis(1500),
        };
        let json = serde_json::to_value(Figures { steps: &[step] }).expect("serializes");
        let step = &json["steps"][0];
        assert_eq!(step["target"], 20);
        assert_eq!(step["achieved"], 19.5);
        assert_eq!(step["patches_per_s"], 40.0);
        assert_eq!(step["events_per_s"], 39.0);
        assert_eq!(step["events_per_dispatcher_cpu_s"], 390.0);
        assert_eq!(step["p99_ms"], 2.0);
        assert_eq!(step["caught_up_ms"], 1500.0);
    }
}
