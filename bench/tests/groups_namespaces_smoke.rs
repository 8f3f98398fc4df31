//! `make bench-groups NAMESPACES=… RING_KEY=namespace` at a tiny scale against the real control
//! plane: the objects spread over several namespaces, two controllers over every namespace with
//! the label selector, as two kube-rs processes and as two groups on a tier keyed by namespace;
//! each controller reconciles every object in every namespace. A test binary of its own, as
//! `groups_smoke.rs` is: the API server's request counts are global.

mod common;

use std::process::Command;

use common::{
    assert_two_controllers_reconciled_and_the_tier_watched_once,
    run_two_controllers_over_namespaces,
};

const OBJECTS: usize = 24;
const NAMESPACES: usize = 6;

#[test]
fn two_controllers_over_every_namespace_reconcile_everything_on_a_ring_keyed_by_namespace() {
    let run = run_two_controllers_over_namespaces(
        "groups-namespaces",
        &["--kinds", "config-map"],
        OBJECTS,
        NAMESPACES,
    );
    let results = &run.results;
    assert!(
        results.contains("ring keyed by namespace; objects spread over 6 namespaces"),
        "{results}"
    );
    assert!(
        results.contains(&format!(
            "#### ConfigMaps, {OBJECTS} objects in {NAMESPACES} namespaces, 2 controllers"
        )),
        "{results}"
    );
    // A run ends only once each controller has reconciled every object (in every namespace).
    assert_two_controllers_reconciled_and_the_tier_watched_once(&run, OBJECTS);
}

#[test]
fn objects_that_do_not_divide_over_the_namespaces_are_refused_before_anything_runs() {
    let output = Command::new(env!("CARGO_BIN_EXE_kube-dispatch-bench"))
        .args(["compare", "--objects", "10", "--namespaces", "4"])
        .output()
        .expect("the harness runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--objects 10 do not divide evenly over --namespaces 4"),
        "{stderr}"
    );
}
