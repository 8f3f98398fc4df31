//! `make bench` end to end at a tiny scale, against the real control plane: every variant runs
//! on both kinds, reconciles every object and every timed write, and the results and plots are
//! written. The figures themselves are not asserted (they are measurements); what each variant
//! asked of the API server is, since it follows from how each one works.

use std::{path::Path, process::Command};

const OBJECTS: u64 = 40;
const WRITES: u64 = 10;
/// Every variant: both incumbents, each with and without a metadata-only cache, and the tier.
const VARIANTS: [&str; 6] = [
    "kube-rs",
    "kube-rs-metadata",
    "controller-runtime",
    "controller-runtime-metadata",
    "dispatch-1",
    "dispatch-4",
];

/// The figures of one row of a results table, by column header.
fn row(table: &str, label: &str) -> Vec<(String, String)> {
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_owned())
            .collect()
    };
    let header = table
        .lines()
        .find(|l| l.starts_with("| figure |"))
        .map(cells)
        .unwrap_or_default();
    let values = table
        .lines()
        .find(|l| l.starts_with(&format!("| {label} |")))
        .map(cells)
        .unwrap_or_default();
    header.into_iter().zip(values).skip(1).collect()
}

fn figure(table: &str, label: &str, variant: &str) -> f64 {
    row(table, label)
        .into_iter()
        .find(|(column, _)| column == variant)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no figure {label:?} for {variant} in:\n{table}"))
}

#[test]
fn every_variant_reconciles_everything_and_the_results_are_written() {
    let cluster = kube_dispatch_tests::Cluster::shared();
    let controller = Path::new(env!("CARGO_BIN_EXE_bench-controller"));
    let bin_dir = controller.parent().expect("binaries live in a directory");
    for binary in ["kube-dispatch-dispatcher", "kube-dispatch-loadbalancer"] {
        assert!(
            bin_dir.join(binary).exists(),
            "{} is missing: run `cargo build --workspace --bins` first (make test does)",
            bin_dir.join(binary).display()
        );
    }
    let out = std::env::temp_dir().join(format!("kd-bench-smoke-{}", std::process::id()));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The second incumbent, built with the machine's Go as `make bench` builds it.
    let built = Command::new(root.join("bench/controller-runtime/build.sh"))
        .output()
        .expect("the controller-runtime build script runs");
    assert!(
        built.status.success(),
        "building the controller-runtime incumbent failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let controller_runtime = String::from_utf8(built.stdout).expect("a path");
    let output = Command::new(env!("CARGO_BIN_EXE_kube-dispatch-bench"))
        .current_dir(&root)
        .env("KUBECONFIG", cluster.kubeconfig())
        .args([
            "--objects",
            &OBJECTS.to_string(),
            "--kinds",
            "config-map,record",
        ])
        .args([
            "--repeats",
            "1",
            "--writes",
            &WRITES.to_string(),
            "--write-interval",
            "10ms",
        ])
        .arg("--bin-dir")
        .arg(bin_dir)
        .args(["--variants", &VARIANTS.join(",")])
        .args(["--controller-runtime", controller_runtime.trim()])
        .arg("--out")
        .arg(out.join("BENCHMARKS.md"))
        .arg("--plots-dir")
        .arg(out.join("plots"))
        .arg("--logs")
        .arg(out.join("logs"))
        .args(["--command", "smoke test"])
        .output()
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the harness failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let results = std::fs::read_to_string(out.join("BENCHMARKS.md")).expect("results written");
    assert!(results.contains("<!-- bench:default:begin -->\nProduced by `smoke test`"));
    for kind in ["ConfigMaps", "Records (custom resource)"] {
        let table = results
            .split("#### ")
            .find(|t| t.starts_with(&format!("{kind}, {OBJECTS} objects")))
            .unwrap_or_else(|| panic!("no table for {kind} in:\n{results}"));
        for variant in VARIANTS {
            // Every object once at start-up, and every timed write at least once.
            assert!(
                figure(table, "reconciles started", variant) >= (OBJECTS + WRITES) as f64,
                "{kind} {variant}"
            );
            assert!(figure(table, "start to first reconcile (ms)", variant) > 0.0);
        }
        // One LIST and one WATCH per watching process: the kube-rs controller, or each of the
        // three dispatchers whatever the number of replicas (--list-mode paged, the default).
        // controller-runtime (client-go 1.36, WatchListClient on by default) lists by
        // streaming: one WATCH with sendInitialEvents and no LIST.
        for (variant, lists, watches) in [
            ("kube-rs", 1.0, 1.0),
            ("kube-rs-metadata", 1.0, 1.0),
            ("controller-runtime", 0.0, 1.0),
            ("controller-runtime-metadata", 0.0, 1.0),
            ("dispatch-1", 3.0, 3.0),
            ("dispatch-4", 3.0, 3.0),
        ] {
            assert_eq!(
                figure(table, "API requests on the resource: LIST", variant),
                lists,
                "{kind} {variant}"
            );
            assert_eq!(
                figure(table, "API requests on the resource: WATCH", variant),
                watches,
                "{kind} {variant}"
            );
        }
        // Only the metadata-only caches must read objects one by one.
        for (full, metadata) in [
            ("kube-rs", "kube-rs-metadata"),
            ("controller-runtime", "controller-runtime-metadata"),
        ] {
            assert_eq!(
                figure(table, "API requests on the resource: GET", full),
                0.0
            );
            assert!(
                figure(table, "API requests on the resource: GET", metadata)
                    >= (OBJECTS + WRITES) as f64
            );
        }
        assert!(
            row(table, "controller RSS, peak, largest replica (MiB)")
                .iter()
                .any(|(column, _)| column == "kube-rs ÷ dispatch-1")
        );
        assert!(
            row(table, "controller RSS, peak, largest replica (MiB)")
                .iter()
                .any(|(column, _)| column == "controller-runtime ÷ dispatch-1")
        );
    }
    for plot in [
        "memory-config-map",
        "startup-config-map",
        "memory-record",
        "startup-record",
    ] {
        let png = std::fs::read(out.join("plots").join(format!("{plot}.png"))).expect("plot drawn");
        assert!(png.starts_with(b"\x89PNG"), "{plot} is not a PNG");
    }
    let _ = std::fs::remove_dir_all(&out);
}
