//! `make bench` end to end at a tiny scale, against the real control plane: every variant runs
//! on both kinds, reconciles every object and every timed write, and the results and plots are
//! written. The figures themselves are not asserted (they are measurements); what each variant
//! asked of the API server is, since it follows from how each one works. The figures are read
//! from the JSON the harness writes beside the Markdown (`--json`).

mod common;

use common::{Mode, bin_dir, figure, run_harness, scenario};

const OBJECTS: u64 = 40;
const WRITES: u64 = 10;
/// Every variant: both incumbents, each with and without a metadata-only cache, and the tier
/// with the Rust SDK (its dispatchers sharing whole lists, each listing whole alone, or by
/// streaming) and with controller-runtime ported to the Go SDK.
const VARIANTS: [&str; 9] = [
    "kube-rs",
    "kube-rs-metadata",
    "controller-runtime",
    "controller-runtime-metadata",
    "dispatch-1",
    "dispatch-4",
    "dispatch-stream-1",
    "dispatch-alone-1",
    "go-dispatch-1",
];

#[test]
fn every_variant_reconciles_everything_and_the_results_are_written() {
    let bin_dir = bin_dir();
    for binary in ["kube-dispatch-dispatcher", "kube-dispatch-loadbalancer"] {
        assert!(
            bin_dir.join(binary).exists(),
            "{} is missing: run `cargo build --workspace --bins` first (make test does)",
            bin_dir.join(binary).display()
        );
    }
    // The second incumbent and its port to the Go SDK, built as `make bench` builds them.
    let controller_runtime = common::controller_runtime(false);
    let ported = common::controller_runtime(true);
    let (objects, writes) = (OBJECTS.to_string(), WRITES.to_string());
    let variants = VARIANTS.join(",");
    let run = run_harness(
        "smoke",
        Mode::Compare,
        &[
            "--objects",
            &objects,
            "--kinds",
            "config-map,record",
            "--repeats",
            "1",
            "--writes",
            &writes,
            "--write-interval",
            "10ms",
            "--variants",
            &variants,
            "--controller-runtime",
            controller_runtime.trim(),
            "--controller-runtime-dispatch",
            ported.trim(),
            "--command",
            "smoke test",
        ],
    );
    let results = &run.results;
    assert!(results.contains("<!-- bench:default:begin -->\nProduced by `smoke test`"));
    for (kind, title) in [
        ("config-map", "ConfigMaps"),
        ("record", "Records (custom resource)"),
    ] {
        // The rendered table: its heading, and the incumbents' columns against dispatch-1.
        let table = results
            .split("#### ")
            .find(|t| t.starts_with(&format!("{title}, {OBJECTS} objects")))
            .unwrap_or_else(|| panic!("no table for {title} in:\n{results}"));
        let header = table
            .lines()
            .find(|l| l.starts_with("| figure |"))
            .unwrap_or_else(|| panic!("no header in:\n{table}"));
        for ratio in [
            "kube-rs ÷ dispatch-1",
            "controller-runtime ÷ dispatch-1",
            "kube-rs ÷ dispatch-stream-1",
            "controller-runtime ÷ go-dispatch-1",
        ] {
            assert!(header.contains(&format!("| {ratio} |")), "{header}");
        }
        // The figures, from the JSON.
        let figures = scenario(&run.json, &[kind], OBJECTS as usize);
        for variant in VARIANTS {
            // Every object once at start-up, and every timed write at least once.
            assert!(
                figure(figures, variant, "reconciles") >= (OBJECTS + WRITES) as f64,
                "{kind} {variant}"
            );
            assert!(figure(figures, variant, "first_reconcile_ms") > 0.0);
        }
        // One LIST and one WATCH per watching process: the kube-rs controller, or each of the
        // three dispatchers listing alone (--share-lists=false). Dispatchers sharing their
        // lists (the default) read one LIST made by one of them, as long as they start their
        // watches within a second of each other (their replica opens its sessions at once):
        // fewer LISTs than dispatchers, one WATCH each. controller-runtime (client-go 1.35 and
        // newer, WatchListClient on by default) and dispatchers with --list-mode stream list by
        // streaming: one WATCH with sendInitialEvents and no LIST.
        for (variant, lists, watches) in [
            ("kube-rs", 1.0, 1.0),
            ("kube-rs-metadata", 1.0, 1.0),
            ("controller-runtime", 0.0, 1.0),
            ("controller-runtime-metadata", 0.0, 1.0),
            ("dispatch-alone-1", 3.0, 3.0),
            ("dispatch-stream-1", 0.0, 3.0),
        ] {
            assert_eq!(
                figure(figures, variant, "requests_list"),
                lists,
                "{kind} {variant}"
            );
            assert_eq!(
                figure(figures, variant, "requests_watch"),
                watches,
                "{kind} {variant}"
            );
        }
        for variant in ["dispatch-1", "dispatch-4", "go-dispatch-1"] {
            let lists = figure(figures, variant, "requests_list");
            assert!(
                (1.0..3.0).contains(&lists),
                "{kind} {variant}: {lists} LISTs for 3 dispatchers sharing them"
            );
            assert_eq!(
                figure(figures, variant, "requests_watch"),
                3.0,
                "{kind} {variant}"
            );
        }
        // The Go SDK's client serves each reconcile's read of its object from the delivery.
        assert_eq!(
            figure(figures, "go-dispatch-1", "requests_get"),
            0.0,
            "{kind}"
        );
        // Only the metadata-only caches must read objects one by one.
        for (full, metadata) in [
            ("kube-rs", "kube-rs-metadata"),
            ("controller-runtime", "controller-runtime-metadata"),
        ] {
            assert_eq!(figure(figures, full, "requests_get"), 0.0);
            assert!(figure(figures, metadata, "requests_get") >= (OBJECTS + WRITES) as f64);
        }
    }
    for plot in [
        "memory-config-map",
        "startup-config-map",
        "memory-record",
        "startup-record",
    ] {
        let png =
            std::fs::read(run.out.join("plots").join(format!("{plot}.png"))).expect("plot drawn");
        assert!(png.starts_with(b"\x89PNG"), "{plot} is not a PNG");
    }
}
