//! An API-server restart expires the dispatcher's watch (410 Gone on resume): the re-list must
//! lose no update and no delete, must not re-deliver what did not change, and must show an
//! object that left a subscription's selector meanwhile as gone from it; listing in pages, by
//! streaming and whole alike. And it must do so promptly: until a watch lists again its view is
//! stale, and a deletion made meanwhile is found only by the sweep of that list.
//!
//! One test in this file on purpose: it restarts the shared API server, and cargo runs test
//! binaries one after another.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    ResourceExt,
    api::{Api, DeleteParams, Patch, PatchParams, PostParams},
};
use kube_dispatch_dispatcher::config::ListMode;
use kube_dispatch_proto::v1::{Reason, Subscription};
use kube_dispatch_tests::{
    Cluster, TestNamespace,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
};

/// One dispatcher per way of listing, each the only member of its ring, all watching the same
/// namespace through the same restart.
const LIST_MODES: [ListMode; 3] = [ListMode::Paged, ListMode::Stream, ListMode::Whole];

/// How soon after the restarted API server answers each dispatcher hands out the changes made
/// then. Its watch retries within 2 s while the server is down and lists again at once on 410
/// Gone (`WatchRetry`): in practice within milliseconds of the changes here. A watch that
/// backs off as kube-runtime's default does waits once more after the 410, on a backoff its
/// connection errors have grown meanwhile: 4.7 s to over 5 s in this test.
const RECOVERY: Duration = Duration::from_millis(3500);

/// A dispatcher and the sessions of its two groups: `all` sees every ConfigMap, `selected`
/// those labelled tier=web.
struct Watching {
    mode: ListMode,
    dispatcher: TestDispatcher,
    all: TestSession,
    selected: TestSession,
}

#[tokio::test]
async fn an_apiserver_restart_loses_no_update_and_no_delete() -> kube_dispatch_tests::TestResult {
    kube_dispatch_tests::log_to_file_from_env();
    let ns = TestNamespace::create("dispatch-apiserver-restart").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let web = Subscription {
        label_selector: "tier=web".into(),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let mut watching = Vec::new();
    for mode in LIST_MODES {
        let identity = format!("dispatcher-{mode:?}").to_lowercase();
        let mut config = test_config(&identity, &[identity.as_str()]);
        // The sessions are not polled while the test waits for the restart: give them a long
        // ttl.
        config.settings.limits.default_ttl = Duration::from_secs(60);
        config.list_mode = mode;
        let dispatcher = TestDispatcher::start(config).await?;
        let all = TestSession::open(
            &dispatcher,
            "g",
            "r",
            vec![subscription("v1", "ConfigMap", ns.name())],
        )
        .await?;
        let selected = TestSession::open(&dispatcher, "web", "r", vec![web.clone()]).await?;
        watching.push(Watching {
            mode,
            dispatcher,
            all,
            selected,
        });
    }
    for name in ["a", "b", "c"] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        api.create(&PostParams::default(), &cm).await?;
    }
    let mut w = ConfigMap::default();
    w.metadata.name = Some("w".into());
    w.metadata.labels = Some([("tier".to_owned(), "web".to_owned())].into());
    let w = api.create(&PostParams::default(), &w).await?;
    for Watching {
        mode,
        all,
        selected,
        ..
    } in &mut watching
    {
        let first = all
            .collect_until(Duration::from_secs(30), |g| g.len() >= 4)
            .await;
        assert_eq!(first.len(), 4, "{mode:?}: {first:?}");
        let got = selected
            .collect_until(Duration::from_secs(30), |g| !g.is_empty())
            .await;
        assert_eq!(got.len(), 1, "{mode:?}: {got:?}");
    }

    Cluster::shared()
        .restart_apiserver_expiring_watches(&ns)
        .await?;

    // Changes right after the restart, while the dispatchers are reconnecting and re-listing.
    let client = Cluster::shared().client().await?;
    let api: Api<ConfigMap> = Api::namespaced(client, ns.name());
    let patch = serde_json::json!({ "data": { "v": "2" } });
    let updated = api
        .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    api.delete("b", &DeleteParams::default()).await?;
    // "w" leaves the selection while the watches are re-listing.
    let relabel = serde_json::json!({ "metadata": { "labels": { "tier": "db" } } });
    api.patch("w", &PatchParams::default(), &Patch::Merge(&relabel))
        .await?;
    let made = Instant::now();

    let key = |name: &str| format!("/ConfigMap/{}/{name}", ns.name());
    let a_rv = updated.resource_version().unwrap();
    let (ka, kb, kc, kw) = (key("a"), key("b"), key("c"), key("w"));
    // The three dispatchers recover side by side: what each hands out by the deadline.
    let mut recovered = Vec::new();
    for Watching { mode, all, .. } in &mut watching {
        let got = all
            .collect_until(RECOVERY.saturating_sub(made.elapsed()), |g| {
                g.iter().any(|r| r.key == ka && r.resource_version == a_rv)
                    && g.iter().any(|r| r.key == kb && r.deleted)
            })
            .await;
        eprintln!(
            "{mode:?}: delivered by {:?} after the changes",
            made.elapsed()
        );
        recovered.push(got);
    }
    for (
        Watching {
            mode,
            dispatcher,
            mut all,
            mut selected,
        },
        got,
    ) in watching.into_iter().zip(recovered)
    {
        let a = got.iter().find(|r| r.key == ka).unwrap_or_else(|| {
            panic!("{mode:?}: the update after the restart, within {RECOVERY:?}")
        });
        assert_eq!(
            (Reason::try_from(a.reason)?, a.resource_version.as_str()),
            (Reason::Modified, a_rv.as_str()),
            "{mode:?}"
        );
        let b = got.iter().find(|r| r.key == kb).unwrap_or_else(|| {
            panic!("{mode:?}: the delete after the restart, within {RECOVERY:?}")
        });
        assert_eq!(Reason::try_from(b.reason)?, Reason::Deleted, "{mode:?}");
        // The re-list saw c unchanged: no delivery for it.
        let rest = all.collect_until(Duration::from_secs(2), |_| false).await;
        let c: Vec<_> = got.iter().chain(&rest).filter(|r| r.key == kc).collect();
        assert!(
            c.is_empty(),
            "{mode:?}: unchanged object re-delivered after the re-list: {c:?}"
        );
        // The selector's group is told "w" is gone from it, with its uid.
        let left = selected
            .collect_until(Duration::from_secs(60), |g| g.iter().any(|r| r.key == kw))
            .await;
        let gone: Vec<_> = left
            .iter()
            .filter(|r| r.key == kw)
            .map(|r| (Reason::try_from(r.reason), r.deleted, r.uid.as_str()))
            .collect();
        assert_eq!(
            gone,
            [(
                Ok(Reason::Deleted),
                true,
                w.uid().unwrap_or_default().as_str()
            )],
            "{mode:?}"
        );
        dispatcher.stop().await;
    }
    Ok(())
}
