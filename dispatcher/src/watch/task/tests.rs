//! The watch task against a scripted API server ([`crate::watch::scripted_api`]) and a paused
//! clock: what it asks after each answer, when, and what its group was given.

use std::sync::Arc;

use kube_dispatch_core::subscription::{Parts, Payload};
use std::time::Duration;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

use kube_dispatch_core::{
    children::ChildIndex, handover::Slice, key::KeyRef, subscription::OwnerKind,
};
use kube_dispatch_proto::Ring;

use super::{Controls, Readiness, WatchError, WatchTask};
use crate::{
    config::ListMode,
    watch::{
        fan_out::{Subscriber, WatchCounts},
        scripted_api::{ApiServer, Member, alone, config_maps, named, object, owned_object, until},
    },
};

/// The task of a watch of ConfigMaps in every namespace, listing the `mode` way, with one group
/// subscribed, against a scripted API server.
struct Scripted {
    api: ApiServer,
    member: Member,
    readiness: watch::Receiver<Readiness>,
    cancel: CancellationToken,
    counts: Arc<WatchCounts>,
    children: Arc<ChildIndex>,
}

impl Scripted {
    fn start(mode: ListMode) -> Self {
        Self::subscribed(mode, None)
    }

    /// As [`Scripted::start`], the group subscribed to the ConfigMaps that objects of `owner`
    /// control when it is given.
    fn subscribed(mode: ListMode, owner: Option<OwnerKind>) -> Self {
        Self::subscribed_on(mode, owner, alone())
    }

    /// A watch feeding the keys of `slice` to one group, subscribed with `owner` if given.
    fn subscribed_on(
        mode: ListMode,
        owner: Option<OwnerKind>,
        slice: watch::Receiver<Arc<Slice>>,
    ) -> Self {
        Self::reading(mode, owner, slice, (false, Payload::KeyOnly))
    }

    /// As [`Scripted::subscribed_on`], asking for protobuf if `protobuf`, the group subscribed
    /// with `payload`.
    fn reading(
        mode: ListMode,
        owner: Option<OwnerKind>,
        slice: watch::Receiver<Arc<Slice>>,
        (protobuf, payload): (bool, Payload),
    ) -> Self {
        let (client, api) = ApiServer::start();
        let cancel = CancellationToken::new();
        let member = Member::join("g", slice.clone(), &cancel);
        let (readiness_tx, readiness) = watch::channel(Readiness::Starting);
        let (counts, children) = (Arc::<WatchCounts>::default(), Arc::<ChildIndex>::default());
        let task = WatchTask::new(
            client,
            config_maps(),
            mode,
            slice,
            Controls {
                counts: counts.clone(),
                subscribers: Arc::new(std::sync::RwLock::new(vec![Subscriber {
                    group: member.group.clone(),
                    payload,
                    owner,
                    named_by: None,
                    changes_of: Parts::ALL_CHANGES,
                }])),
                joined: Arc::default(),
                readiness: readiness_tx,
                children: children.clone(),
                sharing: None,
                protobuf,
            },
        );
        tokio::spawn(task.run(cancel.clone()));
        Self {
            api,
            member,
            readiness,
            cancel,
            counts,
            children,
        }
    }

    async fn next(&mut self) -> crate::watch::scripted_api::Asked {
        self.api.next().await
    }

    fn delivered(&self) -> Vec<(String, bool)> {
        self.member.delivered()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A watch that expires (410 Gone) lists again at once, and the list's sweep delivers the
/// deletion made while it was away; the unchanged object is not delivered again, and the watch
/// resumes from the new list.
#[tokio::test(start_paused = true)]
async fn a_watch_that_expires_lists_again_at_once_and_delivers_what_was_deleted_meanwhile() {
    let mut api = Scripted::start(ListMode::Paged);
    let list = api.next().await;
    assert!(list.is_paged_list(), "a paged list first: {:?}", list.query);
    list.list(10, &[("a", 5), ("b", 6)]);
    let watch = api.next().await;
    assert!(watch.watch);
    assert_eq!(watch.param("resourceVersion"), Some("10"));
    assert!(matches!(*api.readiness.borrow(), Readiness::Ready));
    assert_eq!(api.delivered(), named(&[("a", false), ("b", false)]));
    let stream = watch.open();
    let expired = Instant::now();
    stream.gone();
    let again = api.next().await;
    assert!(again.is_paged_list(), "listed again: {:?}", again.query);
    assert_eq!(
        again.at - expired,
        Duration::ZERO,
        "a 410 Gone lists again without waiting"
    );
    // b was deleted while the watch was away.
    again.list(20, &[("a", 5)]);
    let resumed = api.next().await;
    assert!(resumed.watch);
    assert_eq!(resumed.param("resourceVersion"), Some("20"));
    assert_eq!(api.delivered(), named(&[("b", true)]));
}

/// A server that refuses streaming lists (no WatchList feature) is listed in pages instead, at
/// once, and the watch becomes ready.
#[tokio::test(start_paused = true)]
async fn a_refused_streaming_list_is_made_in_pages_at_once() {
    let mut api = Scripted::start(ListMode::Stream);
    let first = api.next().await;
    assert!(
        first.streams_list(),
        "a streaming list first: {:?}",
        first.query
    );
    let refused = Instant::now();
    first.refuse(
        422,
        "Invalid",
        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
    );
    let list = api.next().await;
    assert!(list.is_paged_list(), "then a paged list: {:?}", list.query);
    assert_eq!(list.at - refused, Duration::ZERO);
    list.list(10, &[("a", 5)]);
    let watch = api.next().await;
    assert!(watch.watch && !watch.streams_list());
    assert!(matches!(*api.readiness.borrow(), Readiness::Ready));
    assert_eq!(api.delivered(), named(&[("a", false)]));
}

/// A whole list cut short (a resource too large to list in one response within the API
/// server's request timeout) is listed by streaming instead, at once, which the request
/// timeout does not end; once the stream's initial events end, it goes on as the watch.
#[tokio::test(start_paused = true)]
async fn a_whole_list_cut_short_is_listed_by_streaming_at_once() {
    let mut api = Scripted::start(ListMode::Whole);
    let first = api.next().await;
    assert!(
        first.is_whole_list(),
        "a whole list first: {:?}",
        first.query
    );
    let cut = Instant::now();
    first.cut_short(&[("a", 5)]);
    let streaming = api.next().await;
    assert!(
        streaming.streams_list(),
        "then a streaming list: {:?}",
        streaming.query
    );
    assert_eq!(streaming.at - cut, Duration::ZERO);
    let counts = api.counts.clone();
    let applied = || counts.applied.load(std::sync::atomic::Ordering::Relaxed);
    let before = applied();
    let stream = streaming.open();
    stream.send("ADDED", object("a", 5));
    stream.send("ADDED", object("b", 6));
    stream.initial_events_end(10);
    until("the streamed list was read", || applied() >= before + 2).await;
    assert_eq!(api.delivered(), named(&[("a", false), ("b", false)]));
    // The stream goes on as the watch: a deletion (which kube-runtime drops while a
    // streaming list is still sending its initial events) is delivered.
    let deleted = || counts.deleted.load(std::sync::atomic::Ordering::Relaxed);
    stream.send("DELETED", object("b", 11));
    until("the watch read the deletion", || deleted() > 0).await;
    assert_eq!(api.delivered(), named(&[("b", true)]));
}

/// A whole list cut short, on a server that also refuses streaming lists (one older than the
/// WatchList feature, whose refusal does not name `sendInitialEvents`), is made in pages.
#[tokio::test(start_paused = true)]
async fn a_whole_list_cut_short_is_made_in_pages_where_streaming_is_refused() {
    let mut api = Scripted::start(ListMode::Whole);
    api.next().await.cut_short(&[("a", 5)]);
    let streaming = api.next().await;
    assert!(streaming.streams_list(), "{:?}", streaming.query);
    let refused = Instant::now();
    streaming.refuse(
        422,
        "Invalid",
        "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch",
    );
    let list = api.next().await;
    assert!(list.is_paged_list(), "then a paged list: {:?}", list.query);
    assert_eq!(list.at - refused, Duration::ZERO);
    list.list_page(10, &[("a", 5)], "after-a");
    // In pages: the next one has a limit too (the rest of a whole list would not).
    let next = api.next().await;
    assert!(
        next.is_paged_list() && next.param("continue") == Some("after-a"),
        "the next page: {:?}",
        next.query
    );
    next.list(10, &[("b", 6)]);
    let watch = api.next().await;
    assert!(watch.watch && !watch.streams_list());
    assert_eq!(api.delivered(), named(&[("a", false), ("b", false)]));
}

/// A whole list asks for a first page, which the API server answers at once, and then for
/// the rest in one response from where the page ended; the page's objects are handed out
/// before the rest arrives, and the watch starts from the list's resourceVersion.
#[tokio::test(start_paused = true)]
async fn a_whole_list_hands_out_its_first_page_before_the_rest_arrives() {
    let mut api = Scripted::start(ListMode::Whole);
    let first = api.next().await;
    assert!(first.is_whole_list(), "a first page: {:?}", first.query);
    first.list_page(10, &[("a", 5)], "after-a");
    let rest = api.next().await;
    assert!(
        rest.is_rest_of_whole_list() && rest.param("continue") == Some("after-a"),
        "then the rest, without a limit: {:?}",
        rest.query
    );
    assert_eq!(
        api.delivered(),
        named(&[("a", false)]),
        "the first page is handed out while the rest is prepared"
    );
    rest.list(10, &[("b", 6), ("c", 7)]);
    let watch = api.next().await;
    assert!(watch.watch && !watch.streams_list(), "{:?}", watch.query);
    assert_eq!(watch.param("resourceVersion"), Some("10"));
    assert_eq!(api.delivered(), named(&[("b", false), ("c", false)]));
}

/// The rest of a whole list that the API server refuses is asked for again with the same
/// token after a wait, not listed again from its first page; a `continue` too old to serve
/// (410 Gone) lists again from the start.
#[tokio::test(start_paused = true)]
async fn a_refused_rest_of_a_whole_list_is_asked_for_again() {
    let mut api = Scripted::start(ListMode::Whole);
    api.next().await.list_page(10, &[("a", 5)], "after-a");
    let rest = api.next().await;
    let refused = Instant::now();
    rest.refuse(429, "TooManyRequests", "the API server is busy");
    let again = api.next().await;
    assert!(
        again.is_rest_of_whole_list() && again.param("continue") == Some("after-a"),
        "the rest again: {:?}",
        again.query
    );
    assert!(
        again.at - refused >= Duration::from_millis(250),
        "after a wait"
    );
    again.refuse(410, "Expired", "the continue token is too old");
    let relist = api.next().await;
    assert!(
        relist.is_whole_list(),
        "listed from the start: {:?}",
        relist.query
    );
    relist.list(20, &[("a", 5), ("b", 16)]);
    let watch = api.next().await;
    assert!(watch.watch, "{:?}", watch.query);
    assert_eq!(watch.param("resourceVersion"), Some("20"));
    assert_eq!(api.delivered(), named(&[("a", false), ("b", false)]));
}

/// A watch the API server ends (its timeout) is resumed from the last resourceVersion it
/// showed, with no list; the change it showed before it ended is delivered.
#[tokio::test(start_paused = true)]
async fn a_watch_that_ends_resumes_from_where_it_was_without_listing() {
    let mut api = Scripted::start(ListMode::Paged);
    api.next().await.list(10, &[("a", 5)]);
    let watch = api.next().await;
    assert_eq!(api.delivered(), named(&[("a", false)]));
    let stream = watch.open();
    stream.send("MODIFIED", object("a", 11));
    drop(stream);
    let resumed = api.next().await;
    assert!(resumed.watch, "no list: {:?}", resumed.query);
    assert_eq!(resumed.param("resourceVersion"), Some("11"));
    assert_eq!(api.delivered(), named(&[("a", false)]));
}

/// Other errors wait before the watch tries again, 125 ms at first, longer each time but never
/// over 2 s.
#[tokio::test(start_paused = true)]
async fn a_failing_watch_waits_longer_each_time_within_two_seconds() {
    let mut api = Scripted::start(ListMode::Paged);
    api.next().await.list(10, &[("a", 5)]);
    let mut waits = Vec::new();
    let mut failed = None;
    for _ in 0..7 {
        let watch = api.next().await;
        assert!(
            watch.watch,
            "the watch is tried again, with no list: {:?}",
            watch.query
        );
        if let Some(failed) = failed {
            waits.push(watch.at - failed);
        }
        failed = Some(Instant::now());
        watch.refuse(500, "InternalError", "etcd is unavailable");
    }
    assert!(
        waits.iter().all(|w| *w >= Duration::from_millis(125)),
        "every error waits: {waits:?}"
    );
    assert!(
        waits.iter().all(|w| *w <= Duration::from_secs(2)),
        "no wait is over 2 s: {waits:?}"
    );
    assert!(
        waits[0] < Duration::from_millis(500),
        "the first is short: {waits:?}"
    );
}

/// A watch the API server refuses before it started (a 403: no permission) fails its first
/// list with the server's reason, and the task stops asking.
#[tokio::test(start_paused = true)]
async fn a_refused_watch_fails_with_the_reason_and_stops() {
    let mut api = Scripted::start(ListMode::Paged);
    api.next().await.refuse(
        403,
        "Forbidden",
        "configmaps is forbidden: User cannot list resource",
    );
    let failed = tokio::time::timeout(
        crate::watch::scripted_api::PATIENCE,
        api.readiness
            .wait_for(|r| !matches!(r, Readiness::Starting)),
    )
    .await
    .expect("the watch gave up within a minute")
    .expect("the task said why")
    .clone();
    match failed {
        Readiness::Failed(WatchError::Rejected { code, message, .. }) => {
            assert_eq!(code, 403);
            assert!(message.contains("forbidden"), "{message}");
        }
        other => panic!("the watch failed with the server's reason, not {other:?}"),
    }
    assert!(
        api.api.asks_nothing_more().await,
        "the task asks nothing more"
    );
}

/// An owner's children say they are complete only while the index follows the API server:
/// not before the first list ends, not while a re-list after a 410 Gone runs, not while the
/// stream is broken; and once it is back, they are complete again and as new as the stream.
#[tokio::test(start_paused = true)]
async fn children_are_complete_only_while_the_watch_follows_the_api_server() {
    let deployments = OwnerKind {
        group: "apps".into(),
        version: "v1".into(),
        kind: "Deployment".into(),
        namespaced: true,
    };
    let mut api = Scripted::subscribed(ListMode::Paged, Some(deployments.clone()));
    let d1 = |api: &Scripted| {
        let of = api.children.of(&deployments, "apps/Deployment/ns/d1");
        let names: Vec<String> = of.children.iter().map(|c| c.key.to_string()).collect();
        (names, of.complete)
    };
    let list = api.next().await;
    assert_eq!(d1(&api), (vec![], false), "before the first list");
    list.list_raw(10, &[owned_object("c1", 5, "d1")]);
    let stream = api.next().await.open();
    assert_eq!(d1(&api), (vec!["/ConfigMap/ns/c1".to_owned()], true));

    stream.gone();
    let relist = api.next().await;
    assert!(relist.is_paged_list(), "{:?}", relist.query);
    assert!(!d1(&api).1, "incomplete while the re-list runs");
    // c1 was deleted and c2 made while the watch was away.
    relist.list_raw(20, &[owned_object("c2", 15, "d1")]);
    let watch = api.next().await;
    assert_eq!(d1(&api), (vec!["/ConfigMap/ns/c2".to_owned()], true));

    watch.refuse(500, "InternalError", "etcd is unavailable");
    let retried = api.next().await;
    assert!(retried.watch, "{:?}", retried.query);
    assert!(!d1(&api).1, "incomplete while the stream is broken");
    let stream = retried.open();
    stream.send("ADDED", owned_object("c3", 21, "d1"));
    let counts = api.counts.clone();
    until("the watch read the event", || {
        counts.applied.load(std::sync::atomic::Ordering::Relaxed) >= 3
    })
    .await;
    assert_eq!(
        d1(&api),
        (
            vec!["/ConfigMap/ns/c2".to_owned(), "/ConfigMap/ns/c3".to_owned()],
            true
        ),
        "complete again with the stream's first event"
    );
}

/// Only the children of owners this dispatcher may serve are indexed, so the index grows with
/// the owners served here. Owners that come here (the other member left) are shown theirs by a
/// list beside the stream, incomplete until it ends (those served before stay complete);
/// owners that leave are forgotten.
#[tokio::test(start_paused = true)]
async fn only_the_children_of_owners_served_here_are_indexed() {
    let deployments = OwnerKind {
        group: "apps".into(),
        version: "v1".into(),
        kind: "Deployment".into(),
        namespaced: true,
    };
    let two = Arc::new(Slice::fixed("d0", Ring::new(["d0", "d1"])));
    let one = Arc::new(Slice::fixed("d0", Ring::new(["d0"])));
    let (slice_tx, slice) = watch::channel(two.clone());
    let mut api = Scripted::subscribed_on(ListMode::Paged, Some(deployments.clone()), slice);
    let key = |owner: &str| format!("apps/Deployment/ns/{owner}");
    let owners: Vec<String> = (0..12).map(|i| format!("o{i}")).collect();
    let (here, elsewhere): (Vec<&String>, Vec<&String>) = owners
        .iter()
        .partition(|o| two.may_serve(KeyRef::new(&key(o))));
    assert!(!here.is_empty() && !elsewhere.is_empty(), "{here:?}");
    let objects: Vec<String> = owners
        .iter()
        .enumerate()
        .map(|(i, o)| owned_object(&format!("c{i}"), 5, o))
        .collect();
    let shown = |api: &Scripted, owner: &str, _: &Slice| {
        let of = api.children.of(&deployments, &key(owner));
        (of.children.len(), of.complete)
    };

    api.next().await.list_raw(10, &objects);
    let _stream = api.next().await.open();
    for o in &here {
        assert_eq!(shown(&api, o, &two), (1, true), "{o}");
    }
    for o in &elsewhere {
        assert_eq!(shown(&api, o, &two).0, 0, "{o} is served elsewhere");
    }
    assert_eq!(api.children.read().len(), here.len());

    slice_tx.send_replace(one.clone());
    let beside = api.next().await;
    assert!(beside.is_paged_list(), "a list beside: {:?}", beside.query);
    assert_eq!(
        shown(&api, elsewhere[0], &one),
        (0, false),
        "missing, and said to be"
    );
    assert_eq!(
        shown(&api, here[0], &one),
        (1, true),
        "kept all along: complete while the list beside shows the others"
    );
    beside.list_raw(11, &objects);
    until("the list beside ends", || shown(&api, elsewhere[0], &one).1).await;
    for o in &owners {
        assert_eq!(shown(&api, o, &one), (1, true), "{o}");
    }

    slice_tx.send_replace(two.clone());
    until("the owners that left are forgotten", || {
        api.children.read().len() == here.len()
    })
    .await;
    for o in &elsewhere {
        assert_eq!(shown(&api, o, &two).0, 0, "{o}");
    }
}

/// A cold start: the watch of owners begins its own list once the watch of their children has
/// shown them all, so no owner is requested with its children incomplete; and however long
/// that list takes, it waits at most `CHILDREN_WAIT`.
#[tokio::test(start_paused = true)]
async fn the_owners_first_list_waits_for_their_childrens() {
    use super::CHILDREN_WAIT;

    // ConfigMaps owning children of another watch, whose own list is running.
    let owners = OwnerKind {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        namespaced: true,
    };
    for (listed_after, asked_after) in [
        (Some(Duration::from_secs(3)), Duration::from_secs(3)),
        (None, CHILDREN_WAIT),
    ] {
        let children = Arc::new(ChildIndex::default());
        let mut api = Scripted::start(ListMode::Paged);
        api.member.group.owns_from(owners.clone(), children.clone());
        let begun = Instant::now();
        if let Some(after) = listed_after {
            let children = children.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                children.follow(alone().borrow().clone());
                children.own_list_running(false);
            });
        }
        let list = first_list_after(&mut api, begun, asked_after).await;
        list.list_raw(10, &[object("o1", 5)]);
        let _stream = api.next().await.open();
        assert_eq!(api.delivered(), named(&[("o1", false)]));
    }
}

/// Keys that come here while the watch's first list is held for the children are left to that
/// list, which has not been asked for yet: no list beside it is made (it would list every
/// object a second time), and the first list is held no longer than `CHILDREN_WAIT` from its
/// pass's start, however many ring changes come meanwhile.
#[tokio::test(start_paused = true)]
async fn keys_that_come_here_while_the_first_list_is_held_are_left_to_it() {
    use super::CHILDREN_WAIT;

    let owners = OwnerKind {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        namespaced: true,
    };
    let two = Arc::new(Slice::fixed("d0", Ring::new(["d0", "d1"])));
    let one = Arc::new(Slice::fixed("d0", Ring::new(["d0"])));
    // The test keeps the sender too: a closed channel is no ring change.
    let (slice_tx, slice) = watch::channel(two);
    let slice_tx = Arc::new(slice_tx);
    // Children never listed: the first list waits its longest.
    let children = Arc::new(ChildIndex::default());
    let mut api = Scripted::subscribed_on(ListMode::Paged, None, slice);
    api.member.group.owns_from(owners, children);
    let begun = Instant::now();
    let ring_change = slice_tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        // d1 left: every key comes here.
        ring_change.send_replace(one);
    });
    let list = first_list_after(&mut api, begun, CHILDREN_WAIT).await;
    list.list_raw(10, &[object("o1", 5)]);
    let next = api.next().await;
    assert!(
        next.watch,
        "the stream follows its list, with no list beside it: {:?}",
        next.query
    );
}

/// The watch's next request, which must be its first list, asked for `after` from `begun`
/// (within 100 ms).
async fn first_list_after(
    api: &mut Scripted,
    begun: Instant,
    after: Duration,
) -> crate::watch::scripted_api::Asked {
    let list = api.next().await;
    assert!(list.is_paged_list(), "{:?}", list.query);
    let waited = begun.elapsed();
    assert!(
        waited >= after && waited < after + Duration::from_millis(100),
        "the owners' first list was asked for after {waited:?}, not {after:?}"
    );
    list
}

/// Objects read in protobuf are written as JSON only where a group here needs them: one placed
/// on another member is not, nor one placed here for a group that asks for keys only, so a
/// field the table of types does not know in it changes nothing; placed here for a group that
/// asks for whole objects, it makes the watch read the resource in JSON from then on, and it is
/// delivered from the JSON list.
#[tokio::test(start_paused = true)]
async fn objects_read_in_protobuf_are_written_as_json_only_where_needed() {
    use std::sync::atomic::Ordering;

    use kube_dispatch_proto::RequestKey;

    use crate::watch::protobuf::{
        MEDIA_TYPE,
        testing::{config_map, list},
    };

    let two = Slice::fixed("d0", Ring::new(["d0", "d1"]));
    let elsewhere = |name: &str| {
        let key = RequestKey::new("", "ConfigMap", "ns", name).to_string();
        two.owned_elsewhere(KeyRef::new(&key))
    };
    let names: Vec<String> = (0..64).map(|i| format!("o{i}")).collect();
    let here: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !elsewhere(n))
        .collect();
    let there = names
        .iter()
        .find(|n| elsewhere(n))
        .expect("a key placed on d1");
    let cases = [
        (there.as_str(), Payload::Full),
        (here[1], Payload::KeyOnly),
        (here[1], Payload::Full),
    ];
    for (newer, payload) in cases {
        let slice = watch::channel(Arc::new(two.clone())).1;
        let mut api = Scripted::reading(ListMode::Whole, None, slice, (true, payload));
        let first = api.next().await;
        assert!(
            first.is_whole_list() && first.accept.starts_with(MEDIA_TYPE),
            "{first:?}"
        );
        let unknown_field = config_map(newer, "6", "y").str(99, "new");
        first.list_protobuf(list(&[config_map(here[0], "5", "x"), unknown_field], ""));
        let next = api.next().await;
        let fallbacks = api.counts.json_fallbacks.load(Ordering::Relaxed);
        if newer == there || payload == Payload::KeyOnly {
            assert!(next.watch && next.accept.contains(MEDIA_TYPE), "{next:?}");
            assert_eq!(fallbacks, 0);
            let mut expected = vec![(here[0], false)];
            expected.extend((newer != there).then_some((newer, false)));
            expected.sort();
            assert_eq!(api.delivered(), named(&expected));
            continue;
        }
        assert!(
            next.is_whole_list() && !next.accept.contains(MEDIA_TYPE),
            "{next:?}"
        );
        assert_eq!(fallbacks, 1);
        next.list(8, &[(here[0], 5), (newer, 6)]);
        let watch = api.next().await;
        assert!(
            watch.watch && !watch.accept.contains(MEDIA_TYPE),
            "{watch:?}"
        );
        let mut expected = [(here[0], false), (newer, false)];
        expected.sort();
        assert_eq!(api.delivered(), named(&expected));
    }
}

mod handover;
