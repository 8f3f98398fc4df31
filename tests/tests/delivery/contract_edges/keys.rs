//! Contract edges of a key's own object (keys.md, "What a subscription delivers"): selectors,
//! names used again, sessions closed with keys in flight, a controller back after its grace.

use super::support::*;

#[tokio::test]
async fn an_object_that_leaves_a_selector_is_delivered_as_gone_and_back_as_added() -> TestResult {
    let ns = TestNamespace::create("edges-selector").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let web = Subscription {
        label_selector: "tier=web".into(),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let mut s = TestSession::open(&d, "web", "r1", vec![web]).await?;
    let created = api
        .create(&PostParams::default(), &labelled("page", "web"))
        .await?;
    let uid = created.uid().unwrap_or_default();
    let key = format!("/ConfigMap/{}/page", ns.name());
    let relabel = |tier: &'static str| {
        let api = api.clone();
        async move {
            api.patch(
                "page",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {"tier": tier}}})),
            )
            .await
        }
    };

    let mut order = vec![seen(&next(&mut s).await?)];
    relabel("db").await?;
    let left = next(&mut s).await?;
    order.push(seen(&left));
    relabel("web").await?;
    order.push(seen(&next(&mut s).await?));
    println!("a relabelled object, as the controller receives it: {order:#?}");
    assert_eq!(
        order,
        [
            (Reason::Added, key.clone(), uid.clone(), false),
            (Reason::Deleted, key.clone(), uid.clone(), true),
            (Reason::Added, key.clone(), uid.clone(), false),
        ]
    );
    // The last state it was seen in, when the payload carries bodies.
    let body: ConfigMap = serde_json::from_slice(&left.object_json)?;
    assert_eq!(body.uid().as_deref(), Some(uid.as_str()));
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_name_deleted_and_created_again_before_a_poll_arrives_as_both_one_at_a_time() -> TestResult
{
    let ns = TestNamespace::create("edges-recreate").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s = TestSession::open(&d, "g", "r1", subs.clone()).await?;
    // A second group on the same watch tells us when the dispatcher has seen both events.
    let mut observer = TestSession::open(&d, "observer", "o1", subs).await?;
    let key = format!("/ConfigMap/{}/reused", ns.name());

    let first = api
        .create(&PostParams::default(), &labelled("reused", "a"))
        .await?;
    let created = next(&mut s).await?;
    next(&mut observer).await?;
    // Deleted and created again while the controller does not poll.
    api.delete("reused", &DeleteParams::default()).await?;
    let second = api
        .create(&PostParams::default(), &labelled("reused", "b"))
        .await?;
    let second_rv = second.resource_version().unwrap_or_default();
    let watched = observer
        .collect_until(TIMEOUT, |got| {
            got.iter().any(|r| r.resource_version == second_rv)
        })
        .await;
    assert!(
        watched.iter().any(|r| r.resource_version == second_rv),
        "the observer never saw the second object: {watched:?}"
    );

    // One key, one delivery at a time: first the old object's deletion...
    let got = s.poll_acking(&[], Duration::from_secs(2)).await?;
    assert_eq!(got.len(), 1, "{got:?}");
    let gone = &got[0];
    let more = s.poll_acking(&[], Duration::from_millis(200)).await?;
    assert!(more.is_empty(), "the key is in flight: {more:?}");
    s.ack(&[gone.delivery_id]).await?;
    // ... then the new one.
    let new = next(&mut s).await?;
    let order = [seen(&created), seen(gone), seen(&new)];
    println!("a name re-used between two polls, as the controller receives it: {order:#?}");
    let (uid_a, uid_b) = (
        first.uid().unwrap_or_default(),
        second.uid().unwrap_or_default(),
    );
    assert_ne!(uid_a, uid_b);
    assert_eq!(
        order,
        [
            (Reason::Added, key.clone(), uid_a.clone(), false),
            (Reason::Deleted, key.clone(), uid_a, true),
            (Reason::Added, key.clone(), uid_b, false),
        ]
    );
    assert_eq!(new.resource_version, second_rv);
    d.stop().await;
    Ok(())
}

/// A client that closes its session (or reopens one for its replica) without acknowledging what
/// it was handed, as a client other than the SDK may: the dispatcher cannot know its reconciles
/// stopped, so those keys go to another session only once the closed one would have expired,
/// never at once, and no two sessions hold one key. What was only queued for it goes at once.
#[tokio::test]
async fn keys_in_flight_on_a_closed_or_replaced_session_wait_for_its_fence() -> TestResult {
    use kube_dispatch_proto::v1::CloseSessionRequest;
    use tokio::time::Instant;

    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let ttl = d.handles.groups.settings().limits.default_ttl;
    for (round, name) in ["closed", "replaced"].into_iter().enumerate() {
        // A namespace each, so the group's first list shows nothing.
        let ns = TestNamespace::create(&format!("edges-{name}")).await?;
        let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
        let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
        let group = format!("fence-{name}");
        let mut first = TestSession::open(&d, &group, "replica-a", subs()).await?;
        let cm = labelled(&format!("cm-{round}"), "x");
        api.create(&PostParams::default(), &cm).await?;
        let held = first.hold(TIMEOUT).await?;
        let renewed = Instant::now();
        assert_eq!(held.len(), 1, "{name}: the first session holds the key");
        let mut other = if name == "closed" {
            let other = TestSession::open(&d, &group, "replica-b", subs()).await?;
            first
                .client
                .close_session(CloseSessionRequest {
                    session_id: first.id.clone(),
                    ..Default::default()
                })
                .await?;
            other
        } else {
            // The same replica id opens a new session: the old one is replaced.
            TestSession::open(&d, &group, "replica-a", subs()).await?
        };
        let after = Instant::now();
        let got = other
            .collect_until(ttl + Duration::from_secs(10), |g| !g.is_empty())
            .await;
        let waited = renewed.elapsed();
        assert_eq!(got.len(), 1, "{name}: the key is delivered again");
        assert!(
            waited >= ttl - Duration::from_millis(200),
            "{name}: delivered again {waited:?} after its session's last renewal, {:?} after it was {name}, before the ttl {ttl:?}",
            after.elapsed()
        );
        println!(
            "{name} with a key in flight: delivered to another session {:?} after the session's last renewal (ttl {ttl:?})",
            waited
        );
    }
    d.stop().await;
    Ok(())
}

/// A controller away for longer than `--idle-group-grace` (every replica stopped) comes back to
/// a new group: it is handed every object that exists, as a controller-runtime controller that
/// restarts lists them, and not the deletions made while it was away, which no group was left
/// to remember (keys.md, "A controller that comes back"). Within the grace, its group and what
/// it remembers are kept: the deletion is delivered.
#[tokio::test]
async fn a_controller_back_after_the_idle_grace_starts_from_what_exists() -> TestResult {
    use kube_dispatch_tests::wait_for;

    for (away_longer, name) in [(false, "within"), (true, "past")] {
        // A grace the test stays well within, or one it waits out.
        let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
        config.settings.idle_group_grace = if away_longer {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(60)
        };
        let d = TestDispatcher::start(config).await?;
        let ns = TestNamespace::create(&format!("edges-idle-{name}")).await?;
        let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
        for object in ["kept", "gone"] {
            api.create(&PostParams::default(), &labelled(object, "x"))
                .await?;
        }
        let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
        let group = format!("idle-{name}");
        let mut s = TestSession::open(&d, &group, "r1", subs()).await?;
        let first = s.collect_until(TIMEOUT, |g| g.len() >= 2).await;
        assert_eq!(first.len(), 2);
        s.client
            .close_session(kube_dispatch_proto::v1::CloseSessionRequest {
                session_id: s.id.clone(),
                ..Default::default()
            })
            .await?;
        let groups = d.handles.groups.clone();
        let group_of = |group: &str| groups.all().iter().any(|g| g.id.name == group);
        if away_longer {
            wait_for(TIMEOUT, "the idle group to be dropped", || {
                std::future::ready(!group_of(&group))
            })
            .await?;
        }
        api.delete("gone", &DeleteParams::default()).await?;
        let key = |object: &str| format!("/ConfigMap/{}/{object}", ns.name());
        // Let the watch see the deletion before the controller comes back. Past the grace no
        // group of the controller is left to show it: a probe group on the same resource does,
        // once it holds "kept" (queued: the probe never polls) and no longer holds "gone"
        // alive.
        let probe_group = format!("{group}-probe");
        let probe = if away_longer {
            Some(TestSession::open(&d, &probe_group, "probe", subs()).await?)
        } else {
            None
        };
        let watched = if away_longer { &probe_group } else { &group };
        wait_for(TIMEOUT, "the deletion to be seen", || {
            let seen = groups.all().iter().any(|g| {
                g.id.name == *watched
                    && (!away_longer || g.key_status(&key("kept")).is_some())
                    && g.key_status(&key("gone")).is_none_or(|k| k.deleted)
            });
            std::future::ready(seen)
        })
        .await?;
        drop(probe);
        let mut back = TestSession::open(&d, &group, "r1", subs()).await?;
        let got = back
            .collect_until(Duration::from_secs(3), |g| g.len() >= 2)
            .await;
        let mut seen: Vec<(Reason, String, bool)> = got
            .iter()
            .map(|r| (reason(r), r.key.clone(), r.deleted))
            .collect();
        seen.sort();
        let expected = if away_longer {
            vec![(Reason::Added, key("kept"), false)]
        } else {
            vec![(Reason::Deleted, key("gone"), true)]
        };
        assert_eq!(seen, expected, "back {name} the grace");
        d.stop().await;
    }
    Ok(())
}
