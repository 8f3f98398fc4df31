//! The chaos suite (`tests/src/chaos.rs`): the tier under seeded random faults, checked by the
//! journal. The short mode runs in `make test` with fixed seeds; `make chaos` runs the long
//! mode (`KD_CHAOS_SECONDS`, `KD_CHAOS_SEED`).

use std::time::Duration;

use kube_dispatch_tests::chaos::{Settings, run};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// lost must be 0 and concurrent 0. Deletions lost around a dispatcher kill are counted apart,
/// to point at the path that lost them, and must be 0 too.
fn check(report: &kube_dispatch_tests::chaos::Report) {
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

/// Short mode: a fixed list of seeds, 40 s of faults each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_faults_lose_nothing_and_never_overlap() -> TestResult {
    for seed in [1, 2] {
        let report = run(Settings {
            seed,
            duration: Duration::from_secs(40),
            objects: 12,
            write_period: Duration::from_millis(40),
        })
        .await?;
        println!("{report}");
        check(&report);
    }
    Ok(())
}

/// Long mode, `make chaos`: `KD_CHAOS_SECONDS` of faults (default 600) from `KD_CHAOS_SEED`
/// (default: the clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long mode: run with make chaos"]
async fn long_chaos() -> TestResult {
    let seconds: u64 = std::env::var("KD_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let seed: u64 = std::env::var("KD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        });
    println!("chaos: seed {seed}, {seconds} s of faults (replay with KD_CHAOS_SEED={seed})");
    let report = run(Settings {
        seed,
        duration: Duration::from_secs(seconds),
        objects: 25,
        write_period: Duration::from_millis(30),
    })
    .await?;
    println!("{report}");
    check(&report);
    Ok(())
}
