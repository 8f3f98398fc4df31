//! `make bench-shards` at a tiny scale against the real control plane: with the ring keyed by
//! name every dispatcher decodes the objects the others own; keyed by namespace, the API server
//! sends each only its own (`shardSelector`), and every object is still reconciled. A test
//! binary of its own, as `ceiling_smoke.rs` is: the API server's request counts are global.

mod common;

use common::{figure, run_harness};

#[test]
fn the_sharding_benchmark_shows_each_dispatcher_receiving_its_own_namespaces_only() {
    let run = run_harness(
        "shards",
        &[
            "--shards",
            "--shard-namespaces",
            "12",
            "--objects",
            "3",
            "--dispatchers",
            "3",
            "--writes",
            "24",
            "--write-interval",
            "10ms",
            "--command",
            "shards smoke test",
        ],
    );
    let results = &run.results;
    assert!(results.contains("<!-- bench:shards:begin -->\nProduced by `shards smoke test`"));
    // Keyed by name, each of the 3 dispatchers lists all 36 objects and keeps its third.
    let decoded = |ring: &str| {
        figure(
            results,
            "cold start: objects decoded by all dispatchers",
            ring,
        )
    };
    let elsewhere = |ring: &str| {
        figure(
            results,
            "cold start: of them owned by another dispatcher",
            ring,
        )
    };
    let (by_name, by_namespace) = ("ring keyed by name", "ring keyed by namespace");
    assert!(decoded(by_name) >= 3.0 * 36.0, "keyed by name: {results}");
    assert!(elsewhere(by_name) >= 2.0 * 36.0, "keyed by name: {results}");
    // Keyed by namespace, each is sent its own namespaces' objects only.
    assert!(
        (36.0..3.0 * 36.0).contains(&decoded(by_namespace)),
        "keyed by namespace: {results}"
    );
    assert_eq!(
        elsewhere(by_namespace),
        0.0,
        "keyed by namespace: {results}"
    );
}
