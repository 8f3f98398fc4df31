//! `make bench-groups MIX=1` at a tiny scale against the real control plane: two controllers
//! over a mix of resources (one over ConfigMaps, one over Records, a custom resource), spread
//! over namespaces, as two kube-rs processes and as two groups on a tier keyed by namespace;
//! each controller reconciles every object of its kind, and the tier watches each resource once
//! per dispatcher. A test binary of its own, as `groups_smoke.rs` is: the API server's request
//! counts are global.

mod common;

use std::process::Command;

use common::{figure, run_two_controllers_over_namespaces};

const OBJECTS: usize = 12;
const NAMESPACES: usize = 3;

#[test]
fn two_controllers_over_two_resources_each_reconcile_every_object_of_theirs() {
    let run = run_two_controllers_over_namespaces(
        "groups-mixed",
        &["--kinds", "config-map,record", "--mix"],
        OBJECTS,
        NAMESPACES,
    );
    let results = &run.results;
    assert!(
        results.contains(&format!(
            "#### ConfigMaps and Records (custom resource), {OBJECTS} objects of each kind in {NAMESPACES} namespaces, 2 controllers"
        )),
        "{results}"
    );
    assert!(results.contains("a mix of resources"), "{results}");
    // A run ends only once each controller has reconciled every object of its kind, and each
    // write once the controller of its kind has seen it: 12 of each at start-up, 6 writes.
    let scenario = &run.json["scenarios"][0];
    for variant in ["kube-rs", "dispatch-1"] {
        let reconciles = figure(scenario, variant, "reconciles");
        assert!(
            reconciles >= (2 * OBJECTS + 6) as f64,
            "{variant}: {reconciles} reconciles for 2 controllers of {OBJECTS} objects each"
        );
    }
    // One watch per controller for kube-rs; one per resource and dispatcher for the tier.
    let watches = |variant| figure(scenario, variant, "requests_watch");
    assert_eq!(watches("kube-rs"), 2.0, "{:#}", run.json);
    assert_eq!(watches("dispatch-1"), 6.0, "{:#}", run.json);
}

#[test]
fn a_mix_with_fewer_controllers_than_kinds_is_refused_before_anything_runs() {
    let output = Command::new(env!("CARGO_BIN_EXE_kube-dispatch-bench"))
        .args([
            "compare",
            "--kinds",
            "config-map,record",
            "--mix",
            "--groups",
            "1,2",
        ])
        .output()
        .expect("the harness runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--groups 1 cannot cover the 2 kinds of --mix"),
        "{stderr}"
    );
}
