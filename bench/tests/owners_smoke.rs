//! `make bench-owners` at a tiny scale against the real control plane: Records owning two
//! ConfigMaps each, on kube-rs (children from its reflector's store), on the tier with the
//! children from each request, and on the tier listing them. Every variant reconciles every
//! owner, survives the timed writes to owners and to children, and leaves every child as its
//! owner says; the tier with children in its requests lists no ConfigMaps after its start,
//! where the listing one lists in every reconcile. The same with the owners spread over two
//! namespaces on a ring keyed by namespace, every controller selecting owners and children by
//! the run's label. A test binary of its own, as the other smoke tests are: the API server's
//! request counts are global.

mod common;

use common::{Mode, figure, run_harness, scenario};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt, api::ListParams};
use kube_dispatch_bench::{Record, SET_LABEL, child_is_current, child_name};

const OWNERS: usize = 10;
const CHILDREN: usize = 2;

/// `compare` of Records owning [`CHILDREN`] ConfigMaps each, one run of each of `variants`
/// with 6 timed writes, written into `section`; `extra` adds to the arguments.
fn owners_run(section: &str, variants: &str, extra: &[&str]) -> common::Run {
    let (owners, children) = (OWNERS.to_string(), CHILDREN.to_string());
    let mut args = vec![
        "--kinds",
        "record",
        "--objects",
        &owners,
        "--children",
        &children,
        "--variants",
        variants,
        "--repeats",
        "1",
        "--writes",
        "6",
        "--write-interval",
        "10ms",
        "--section",
        section,
        "--command",
        "owners smoke test",
    ];
    args.extend_from_slice(extra);
    run_harness(section, Mode::Compare, &args)
}

#[tokio::test]
async fn every_variant_keeps_the_children_and_only_the_listing_tier_lists_them() {
    let run = owners_run("owners", "kube-rs,dispatch-1,dispatch-list-1", &[]);
    assert!(run.results.contains("<!-- bench:owners:begin -->"));
    assert!(
        run.results.contains(&format!(
            "#### Records (custom resource), {OWNERS} objects owning {CHILDREN} ConfigMaps each"
        )),
        "{}",
        run.results
    );
    let scenario = scenario(&run.json, &["record"], OWNERS);
    for variant in ["kube-rs", "dispatch-1", "dispatch-list-1"] {
        let reconciles = figure(scenario, variant, "reconciles");
        assert!(
            reconciles >= OWNERS as f64,
            "{variant}: {reconciles} reconciles of {OWNERS} owners"
        );
    }
    // Each reconcile of the listing tier lists the owner's children; the tier with children in
    // its requests lists nothing but its dispatchers' own watches (one list each of Records
    // and ConfigMaps per dispatcher, 3 dispatchers), like kube-rs's two watches. (The counts are
    // the API server's, for every client: `make test` runs this test alone.)
    let lists = |variant| figure(scenario, variant, "requests_list");
    assert!(
        lists("dispatch-list-1") >= OWNERS as f64 + lists("dispatch-1"),
        "{:#}",
        run.json
    );
    assert!(
        lists("dispatch-1") < OWNERS as f64,
        "no LIST per reconcile: {:#}",
        run.json
    );
    // Its requests carry the children's bodies: a cold start takes them from there instead of
    // a GET of each child (which made at least one GET per child).
    assert!(
        figure(scenario, "dispatch-1", "requests_get") < (OWNERS * CHILDREN) as f64,
        "children taken from the requests, not read by a GET each: {:#}",
        run.json
    );
    assert_eq!(
        figure(scenario, "kube-rs", "requests_get"),
        0.0,
        "read from the cache"
    );

    // After the last run's writes, every child holds what its owner says.
    let cluster = kube_dispatch_tests::Cluster::shared();
    let client = cluster.client().await.expect("a client");
    let namespace = format!("kd-bench-record-{OWNERS}-owning-{CHILDREN}");
    let records: Api<Record> = Api::namespaced(client.clone(), &namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let kids = configmaps
        .list(&ListParams::default())
        .await
        .expect("children listed");
    for owner in records
        .list(&ListParams::default())
        .await
        .expect("owners")
        .items
    {
        for i in 0..CHILDREN {
            let name = child_name(&owner.name_any(), i);
            let child = kids
                .items
                .iter()
                .find(|c| c.name_any() == name)
                .unwrap_or_else(|| panic!("{name} exists"));
            assert!(
                child_is_current(&owner, child),
                "{name} was repaired: {child:?}"
            );
        }
    }
}

/// `make bench-owners NAMESPACES=2 RING_KEY=namespace`: owners in two namespaces, each child
/// carrying its owner's label, so kube-rs (watchers with the label selector) and the tier
/// (`labels` and `owns_labelled`) see every owner and child; the writes to owners and to
/// children are followed and repaired in both namespaces.
#[tokio::test]
async fn owners_spread_over_namespaces_keep_their_labelled_children() {
    const NAMESPACES: usize = 2;
    let namespaces = NAMESPACES.to_string();
    let run = owners_run(
        "owners-namespaces",
        "kube-rs,dispatch-1",
        &["--namespaces", &namespaces, "--ring-key", "namespace"],
    );
    assert!(
        run.results
            .contains("ring keyed by namespace; objects spread over 2 namespaces"),
        "{}",
        run.results
    );
    let scenario = scenario(&run.json, &["record"], OWNERS);
    for variant in ["kube-rs", "dispatch-1"] {
        let reconciles = figure(scenario, variant, "reconciles");
        assert!(
            reconciles >= OWNERS as f64,
            "{variant}: {reconciles} reconciles of {OWNERS} owners"
        );
    }
    let per = OWNERS / NAMESPACES;
    let set = format!("owners{CHILDREN}-{NAMESPACES}x{per}");
    let cluster = kube_dispatch_tests::Cluster::shared();
    let client = cluster.client().await.expect("a client");
    for i in 0..NAMESPACES {
        let namespace = format!("kd-{i}-bench-owners{CHILDREN}-{per}");
        let records: Api<Record> = Api::namespaced(client.clone(), &namespace);
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let kids = configmaps
            .list(&ListParams::default())
            .await
            .expect("children listed");
        let owners = records
            .list(&ListParams::default())
            .await
            .expect("owners")
            .items;
        assert_eq!(owners.len(), per, "{namespace}: {owners:?}");
        for owner in owners {
            assert_eq!(owner.labels().get(SET_LABEL), Some(&set));
            for c in 0..CHILDREN {
                let name = child_name(&owner.name_any(), c);
                let child = kids
                    .items
                    .iter()
                    .find(|k| k.name_any() == name)
                    .unwrap_or_else(|| panic!("{namespace}/{name} exists"));
                assert!(
                    child_is_current(&owner, child) && child.labels().get(SET_LABEL) == Some(&set),
                    "{namespace}/{name} was repaired and labelled: {child:?}"
                );
            }
        }
    }
}
