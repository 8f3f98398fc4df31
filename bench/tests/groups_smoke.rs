//! `make bench-groups` at a tiny scale against the real control plane: two distinct
//! controllers as two kube-rs processes and as two groups on one tier both reconcile every
//! object, and the tier's requests to the API server do not grow with the controllers. A test
//! binary of its own, as `metrics_smoke.rs` is: the API server's request counts are global.

mod common;

use common::{
    Mode, TWO_CONTROLLERS, assert_two_controllers_reconciled_and_the_tier_watched_once, run_harness,
};

const OBJECTS: usize = 20;

#[test]
fn two_controllers_reconcile_everything_and_the_tier_watches_once() {
    let objects = OBJECTS.to_string();
    let run = run_harness(
        "groups",
        Mode::Compare,
        &[
            [
                "--kinds",
                "config-map",
                "--objects",
                &objects,
                "--section",
                "groups",
            ]
            .as_slice(),
            &TWO_CONTROLLERS,
        ]
        .concat(),
    );
    let results = &run.results;
    assert!(results.contains("<!-- bench:groups:begin -->"));
    assert!(
        results.contains(&format!(
            "#### ConfigMaps, {OBJECTS} objects, 2 controllers"
        )),
        "{results}"
    );
    // A run ends only once each controller has reconciled every object (in every namespace).
    assert_two_controllers_reconciled_and_the_tier_watched_once(&run, OBJECTS);
}
