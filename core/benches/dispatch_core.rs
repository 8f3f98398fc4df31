//! Micro-benchmark of the dispatch core, without the API server or the network: synthetic
//! changes go into a group's queue and N sessions take and acknowledge them.
//!
//! Prints reconcile requests per second (one thread, so per core) and the memory each known key
//! costs (resident set growth per key, so allocator overhead is included).
//!
//! Run: `make bench-core` (or `cargo bench -p kube-dispatch-core --bench dispatch_core`).
//! Environment: `KD_BENCH_KEYS` (default 1000000) keys for the memory figure; `KD_BENCH_RUNS`
//! (default 5) throughput runs, of which the median is reported.

use std::{
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use kube_dispatch_core::queue::{Change, GroupQueue, Observed, Outcome, QueueConfig};
use kube_dispatch_proto::v1::Reason;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident set size of this process, in bytes (Linux).
fn rss_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn key(i: usize) -> String {
    format!("/ConfigMap/namespace-{:03}/configmap-{i:08}", i % 500)
}

fn uid(i: usize) -> String {
    format!("{:08x}-1234-4abc-8def-{:012x}", i, i)
}

/// Memory per key of a settled queue: every key known, idle, no body.
fn index_bytes_per_key(keys: usize) -> Option<f64> {
    let names: Vec<String> = (0..keys).map(key).collect();
    let before = rss_bytes()?;
    let mut q = GroupQueue::new(QueueConfig::default());
    q.add_session(1, "replica-0");
    let now = Instant::now();
    for (i, k) in names.iter().enumerate() {
        q.observe(
            k,
            Observed {
                resource_version: (1_000_000 + i).to_string(),
                uid: uid(i),
                body: None,
                trace: None,
                fingerprint: None,
            },
            1,
        );
        if i % 1000 == 999 {
            for d in q.take(1, 1000, now) {
                q.ack(1, d.id, Outcome::Success, now);
            }
        }
    }
    for d in q.take(1, usize::MAX, now) {
        q.ack(1, d.id, Outcome::Success, now);
    }
    assert_eq!((q.len(), q.ready_len()), (keys, 0));
    let after = rss_bytes()?;
    black_box(&q);
    Some(after.saturating_sub(before) as f64 / keys as f64)
}

/// Reconcile requests delivered and acknowledged per second, with `sessions` sessions over
/// `keys` hot keys, changes arriving in batches.
fn throughput(keys: usize, sessions: u64, budget: Duration) -> f64 {
    let names: Vec<Arc<str>> = (0..keys).map(|i| Arc::from(key(i))).collect();
    let mut q = GroupQueue::new(QueueConfig::default());
    for s in 0..sessions {
        q.add_session(s, &format!("replica-{s}"));
    }
    let start = Instant::now();
    let mut delivered = 0u64;
    let mut rv = 0u64;
    while start.elapsed() < budget {
        for chunk in names.chunks(1000) {
            for k in chunk {
                rv += 1;
                q.change(
                    k,
                    Change {
                        reason: Reason::Modified,
                        resource_version: rv.to_string(),
                        uid: String::new(),
                        body: None,
                        deleted: false,
                        trace: None,
                    },
                );
            }
            let now = Instant::now();
            for s in 0..sessions {
                for d in q.take(s, 256, now) {
                    delivered += 1;
                    q.ack(s, d.id, Outcome::Success, now);
                }
            }
        }
    }
    let now = Instant::now();
    for s in 0..sessions {
        for d in q.take(s, usize::MAX, now) {
            delivered += 1;
            q.ack(s, d.id, Outcome::Success, now);
        }
    }
    delivered as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run tiny then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let keys = if quick {
        10_000
    } else {
        env_usize("KD_BENCH_KEYS", 1_000_000)
    };
    let runs = if quick {
        1
    } else {
        env_usize("KD_BENCH_RUNS", 5).max(1)
    };
    let budget = if quick {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(2)
    };

    println!("dispatch core micro-benchmark (one thread, no API server, no network)");
    match index_bytes_per_key(keys) {
        Some(b) => println!("  memory per known key ({keys} idle keys, RSS growth): {b:.0} bytes"),
        None => println!("  memory per known key: not measured (no /proc/self/statm)"),
    }
    for sessions in [1u64, 4, 16] {
        let rates: Vec<f64> = (0..runs)
            .map(|_| throughput(10_000, sessions, budget))
            .collect();
        let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = rates.iter().copied().fold(0.0, f64::max);
        println!(
            "  {sessions:>2} sessions, 10000 hot keys: median {:>9.0} reconcile requests/s per core (min {lo:.0}, max {hi:.0}, {runs} runs)",
            median(rates)
        );
    }
}
