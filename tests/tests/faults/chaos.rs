//! The chaos suite (`tests/src/chaos.rs`): the tier under seeded random faults, checked by the
//! journal.
//!
//! - The short mode runs in `make test`: two fixed seeds and one fresh seed per run (printed, so
//!   a red run can be replayed with `SEED=<seed> make chaos-soak SEEDS=1`), 40 s of faults each.
//! - The soak mode, `make chaos-soak SEEDS=N`, runs the short mode over N consecutive seeds from
//!   `SEED` (default: the clock), one after another, with a line per seed and a total.
//! - The long mode, `make chaos`, runs `KD_CHAOS_SECONDS` of faults from `KD_CHAOS_SEED`.
//!
//! `KD_CHAOS_FAULTS=17,18` (`FAULTS=` of the make targets) draws only those kinds of fault
//! (numbered as `inject` in `tests/src/chaos.rs` lists them), to work on one path.
//!
//! With `KD_TEST_LOG=<file>`, the in-process components log there, for reading what led to a
//! failure (see `kube_dispatch_tests::log_to_file_from_env`).

use std::time::Duration;

use kube_dispatch_tests::{
    TestResult,
    chaos::{FAULT_KINDS, Report, Settings, run},
};

/// lost must be 0 and concurrent 0. Deletions lost around a dispatcher kill are counted apart,
/// to point at the path that lost them, and must be 0 too.
fn check(report: &Report) {
    assert!(
        report.lost_in_crash_window.is_empty(),
        "seed {}: deletions lost while their dispatcher was down: {:?}",
        report.seed,
        report.lost_in_crash_window
    );
    assert!(
        report.lost.is_empty(),
        "seed {}: {} final states never reconciled: {:?}",
        report.seed,
        report.lost.len(),
        report.lost
    );
    assert_eq!(
        report.concurrent, 0,
        "seed {}: overlapping reconciles of one key",
        report.seed
    );
}

/// `KD_CHAOS_SEED` if set, else a seed from the clock.
fn seed_from_env() -> u64 {
    std::env::var("KD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        })
}

/// The short mode of `seed`, with the fault kinds of `KD_CHAOS_FAULTS` if set.
fn short(seed: u64) -> Result<Settings, Box<dyn std::error::Error + Send + Sync>> {
    let mut settings = Settings::short(seed);
    settings.faults = faults_from_env()?;
    Ok(settings)
}

/// `KD_CHAOS_FAULTS`: fault kinds separated by commas; none if unset or empty.
fn faults_from_env() -> Result<Vec<u32>, Box<dyn std::error::Error + Send + Sync>> {
    let Ok(list) = std::env::var("KD_CHAOS_FAULTS") else {
        return Ok(Vec::new());
    };
    let mut kinds = Vec::new();
    for k in list.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        match k.parse::<u32>() {
            Ok(n) if n < FAULT_KINDS => kinds.push(n),
            _ => {
                return Err(format!(
                    "KD_CHAOS_FAULTS: {k:?} is not a fault kind (0 to {})",
                    FAULT_KINDS - 1
                )
                .into());
            }
        }
    }
    Ok(kinds)
}

/// Short mode: seeds 1 and 2, then a fresh one, 40 s of faults each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_faults_lose_nothing_and_never_overlap() -> TestResult {
    kube_dispatch_tests::log_to_file_from_env();
    let fresh = seed_from_env();
    println!(
        "chaos: seeds 1, 2 and fresh seed {fresh} (replay with SEED={fresh} make chaos-soak SEEDS=1)"
    );
    for seed in [1, 2, fresh] {
        let report = run(short(seed)?).await?;
        println!("{report}");
        check(&report);
    }
    Ok(())
}

/// Soak mode, `make chaos-soak`: the short mode over `KD_CHAOS_SOAK_SEEDS` seeds (default 10)
/// from `KD_CHAOS_SEED` (default: the clock). Every seed runs even after a failing one; the
/// full report of each failing seed is printed, then the totals, and the test fails at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak mode: run with make chaos-soak"]
async fn chaos_soak() -> TestResult {
    kube_dispatch_tests::log_to_file_from_env();
    let seeds: u64 = std::env::var("KD_CHAOS_SOAK_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let first = seed_from_env();
    println!(
        "chaos soak: {seeds} seeds from {first}, 40 s of faults each (replay one with SEED=<seed> make chaos-soak SEEDS=1)"
    );
    println!("{}", Report::LINE_HEADER);
    let mut totals = kube_dispatch_tests::chaos::Totals::default();
    let mut failed = Vec::new();
    for seed in (first..).take(usize::try_from(seeds)?) {
        let report = run(short(seed)?).await?;
        println!("{}", report.line());
        if !report.clean() {
            println!("{report}");
            failed.push(seed);
        }
        totals.add(&report);
    }
    println!("{totals}");
    assert!(
        failed.is_empty(),
        "seeds with lost or concurrent reconciles: {failed:?}"
    );
    Ok(())
}

/// Long mode, `make chaos`: `KD_CHAOS_SECONDS` of faults (default 600) from `KD_CHAOS_SEED`
/// (default: the clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long mode: run with make chaos"]
async fn long_chaos() -> TestResult {
    kube_dispatch_tests::log_to_file_from_env();
    let seconds: u64 = std::env::var("KD_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let seed = seed_from_env();
    println!("chaos: seed {seed}, {seconds} s of faults (replay with KD_CHAOS_SEED={seed})");
    let report = run(Settings {
        seed,
        duration: Duration::from_secs(seconds),
        objects: 25,
        write_period: Duration::from_millis(30),
        faults: faults_from_env()?,
    })
    .await?;
    println!("{report}");
    check(&report);
    Ok(())
}
