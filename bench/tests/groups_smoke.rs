//! `make bench-groups` at a tiny scale against the real control plane: two distinct
//! controllers as two kube-rs processes and as two groups on one tier both reconcile every
//! object, and the tier's requests to the API server do not grow with the controllers. A test
//! binary of its own, as `metrics_smoke.rs` is: the API server's request counts are global.

mod common;

use common::{figure, run_harness};

const OBJECTS: usize = 20;

#[test]
fn two_controllers_reconcile_everything_and_the_tier_watches_once() {
    let objects = OBJECTS.to_string();
    let run = run_harness(
        "groups",
        &[
            "--objects",
            &objects,
            "--kinds",
            "config-map",
            "--groups",
            "2",
            "--variants",
            "kube-rs,dispatch-1",
            "--repeats",
            "1",
            "--writes",
            "5",
            "--write-interval",
            "10ms",
            "--section",
            "groups",
            "--command",
            "groups smoke test",
        ],
    );
    let results = &run.results;
    assert!(results.contains("<!-- bench:groups:begin -->"));
    assert!(
        results.contains(&format!(
            "#### ConfigMaps, {OBJECTS} objects, 2 controllers"
        )),
        "{results}"
    );
    for variant in ["kube-rs", "dispatch-1"] {
        // Each controller reconciled every object at least once.
        let reconciles = figure(results, "reconciles started", variant);
        assert!(
            reconciles >= (2 * OBJECTS) as f64,
            "{variant}: {reconciles} reconciles for 2 controllers of {OBJECTS} objects"
        );
    }
    // Two kube-rs controllers watch twice; the tier watches once per dispatcher, whatever
    // the number of controllers (3 dispatchers).
    assert_eq!(
        figure(results, "API requests on the resource: WATCH", "kube-rs"),
        2.0
    );
    assert_eq!(
        figure(results, "API requests on the resource: WATCH", "dispatch-1"),
        3.0
    );
}
