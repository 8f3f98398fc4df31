//! `make bench-daily` at a tiny scale against the real control plane: a kube-rs controller with
//! a cold standby, controller-runtime with a warm one and the tier each meet a rollout of their
//! replicas, and the tier a rolling upgrade of its dispatchers, with a writer all along. Every
//! write is reconciled; a new replica of an incumbent lists everything again, while the tier's
//! new replicas read nothing from the API server; restarted dispatchers list what they serve.
//! A test binary of its own: the API server's request counts are global.

mod common;

use common::{Mode, run_harness};
use serde_json::Value;

#[test]
fn a_rollout_costs_the_tier_no_read_and_every_write_is_reconciled_through_each_event() {
    let controller_runtime = common::controller_runtime(false);
    let run = run_harness(
        "daily",
        Mode::Daily,
        &[
            "--objects",
            "200",
            "--shapes",
            "kube-rs-standby,controller-runtime-warm,tier",
            "--repeats",
            "1",
            "--writes",
            "10",
            "--write-interval",
            "50ms",
            "--controller-runtime",
            &controller_runtime,
            "--command",
            "daily smoke test",
        ],
    );
    assert!(
        run.results
            .contains("<!-- bench:daily:begin -->\nProduced by `daily smoke test`")
    );
    let met = |shape: &str, name: &str| event(&run.json, shape, name);
    for (shape, events) in [
        ("kube-rs-standby", &["steady", "rollout"][..]),
        ("controller-runtime-warm", &["steady", "rollout"]),
        ("tier", &["steady", "rollout", "tier-upgrade"]),
    ] {
        for name in events {
            let e = met(shape, name);
            // The harness fails the run if any write goes unreconciled; each event had some.
            assert!(number(e, "writes") >= 1.0, "{e:#}");
            assert!(number(e, "max_ms") > 0.0, "{e:#}");
            assert!(number(e, "recovered_s") <= number(e, "window_s"), "{e:#}");
        }
    }
    // A new kube-rs replica leads cold: it lists everything again. A new controller-runtime
    // replica warms its cache as a standby, by a streaming list (client-go's WatchListClient).
    let kube_rs = met("kube-rs-standby", "rollout");
    assert!(number(kube_rs, "lists") >= 1.0, "{kube_rs:#}");
    let warm = met("controller-runtime-warm", "rollout");
    assert!(number(warm, "watch_lists") >= 1.0, "{warm:#}");
    // The tier's new replicas are served by the dispatchers, which read nothing for them.
    let tier = met("tier", "rollout");
    assert_eq!(number(tier, "lists"), 0.0, "{tier:#}");
    assert_eq!(number(tier, "gets"), 0.0, "{tier:#}");
    // Each restarted dispatcher lists the keys it serves, and a clean rolling upgrade judges
    // no dispatcher dead (which would make the keys that move from it wait out the bound),
    // unless a stopping dispatcher could not write its drained release (an API server too slow
    // to answer it): then the others wait, as they must.
    let upgrade = met("tier", "tier-upgrade");
    assert!(number(upgrade, "lists") >= 3.0, "{upgrade:#}");
    let unreleased = [
        "could not mark the dispatcher Lease drained",
        "could not release the dispatcher Lease",
    ];
    if unreleased.iter().any(|text| common::logged(&run, text)) {
        eprintln!(
            "a stopping dispatcher did not release its Lease: members judged dead not checked"
        );
    } else {
        for name in ["steady", "rollout", "tier-upgrade"] {
            let e = met("tier", name);
            assert_eq!(number(e, "judged_dead"), 0.0, "{e:#}");
        }
    }
}

/// The tier with owners and children: a rollout of its replicas reads nothing beyond what its
/// writes cost, and a rolling upgrade of its dispatchers reads almost nothing one by one (the
/// owners that move come with their bodies and all their children's; what is left are the few
/// keys a write made ready during a handover), where it read most of the objects by a GET each
/// before.
#[test]
fn owners_and_their_children_move_through_a_tier_upgrade_with_few_reads() {
    let (owners, children) = (100, 2);
    let run = run_harness(
        "daily-owners",
        Mode::Daily,
        &[
            "--objects",
            &owners.to_string(),
            "--children",
            &children.to_string(),
            "--shapes",
            "tier",
            "--repeats",
            "1",
            "--writes",
            "10",
            "--write-interval",
            "50ms",
            "--command",
            "daily owners smoke test",
        ],
    );
    assert!(
        run.results
            .contains("Records of 2048 bytes owning 2 ConfigMaps each")
    );
    // No read of its own; a write of a child may cost its owner's reconcile a read of the
    // owner (when the dispatcher no longer keeps the owner's body), so at most one per write.
    let rollout = event(&run.json, "tier", "rollout");
    assert_eq!(number(rollout, "lists"), 0.0, "{rollout:#}");
    assert!(
        number(rollout, "gets") <= number(rollout, "writes"),
        "{rollout:#}"
    );
    let upgrade = event(&run.json, "tier", "tier-upgrade");
    assert!(number(upgrade, "lists") >= 3.0, "{upgrade:#}");
    let objects = f64::from(owners * (1 + children));
    assert!(
        number(upgrade, "gets") <= objects / 10.0,
        "{} GETs of {objects} objects: {upgrade:#}",
        number(upgrade, "gets")
    );
}

/// The figures of `name` met by `shape` in a run's figures.
fn event<'a>(figures: &'a Value, shape: &str, name: &str) -> &'a Value {
    figures["runs"]
        .as_array()
        .expect("runs in the figures")
        .iter()
        .find(|r| r["shape"] == shape && r["event"] == name)
        .unwrap_or_else(|| panic!("no {name} of {shape} in:\n{figures:#}"))
}

/// The figure `key` of an event.
fn number(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no {key} in {v:#}"))
}
