//! The watch task as the ring changes: the lists beside the stream a handover asks for, and
//! those it spares.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use kube_dispatch_core::{handover::Slice, key::KeyRef};
use kube_dispatch_proto::Ring;

use super::Scripted;
use crate::{
    config::ListMode,
    watch::{
        fan_out::WatchCounts,
        scripted_api::{Asked, named, object, until},
    },
};

/// A dispatcher that handed nothing out while its watch listed (warming up to join) kept every
/// key it owns, and every change of them: when its gate opens on the ring it listed under, it
/// serves them without a list beside the stream. Had a member left the ring meanwhile, the keys
/// that came here from it were not kept, and the gate's opening lists beside the stream.
#[tokio::test(start_paused = true)]
async fn a_gate_that_opens_on_what_the_groups_kept_lists_nothing_beside() {
    use std::{collections::BTreeMap, sync::atomic::Ordering};

    use kube_dispatch_core::{handover::Handover, leases::Peer};

    let live = |names: &[&str]| -> BTreeMap<String, Peer> {
        names
            .iter()
            .map(|n| ((*n).to_owned(), Peer::default()))
            .collect()
    };
    for member_left in [false, true] {
        let now = std::time::Instant::now();
        let mut handover = Handover::new("d0", Duration::from_secs(60), now, false);
        handover.renewed(now + Duration::from_secs(3600));
        let listed_on = if member_left {
            live(&["d0", "d1"])
        } else {
            live(&["d0"])
        };
        let warming = handover.update(&listed_on, 0, true, now);
        let (slice_tx, slice) = watch::channel(Arc::new(warming));
        let mut api = Scripted::subscribed_on(ListMode::Paged, None, slice);
        let list = api.next().await;
        assert!(list.is_paged_list(), "{:?}", list.query);
        list.list(10, &[("a", 5), ("b", 6)]);
        let stream = api.next().await.open();
        stream.send("MODIFIED", object("a", 11));
        until("the change is seen", || {
            api.counts.applied.load(Ordering::Relaxed) >= 3
        })
        .await;
        assert_eq!(api.delivered(), [], "nothing handed out while warming up");
        if member_left {
            let without_d1 = handover.update(&live(&["d0"]), 0, true, now);
            slice_tx.send_replace(Arc::new(without_d1));
        }
        let open = handover.update(&live(&["d0"]), 0, false, now);
        assert!(open.is_settled(), "the gate opens: {open:?}");
        slice_tx.send_replace(Arc::new(open));
        if member_left {
            let beside = api.next().await;
            assert!(beside.is_paged_list(), "a list beside: {:?}", beside.query);
            beside.list(12, &[("a", 11), ("b", 6)]);
        } else {
            assert!(api.api.asks_nothing_more().await, "no list beside");
        }
        let mut got = Vec::new();
        while got.len() < 2 {
            api.member.woken().await;
            got.extend(api.delivered());
        }
        got.sort();
        assert_eq!(got, named(&[("a", false), ("b", false)]));
        let counted = |c: &WatchCounts| {
            let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            (load(&c.side_lists), load(&c.side_lists_spared))
        };
        let want = if member_left { (1, 0) } else { (0, 1) };
        assert_eq!(counted(&api.counts), want, "member left: {member_left}");
    }
}

/// A member dies while this dispatcher serves: the keys that come here are held until its wait
/// ends, and the watch lists beside its stream at once so that its group indexes them. One of
/// them deleted while the watch is away (410 Gone) is missing from the re-list: its deletion is
/// held and delivered once the gate opens, with the held keys that exist (shown by the list
/// the gate's opening makes). Without that first list nothing here knew the key existed.
#[tokio::test(start_paused = true)]
async fn a_held_key_deleted_while_the_watch_is_away_is_delivered_once_the_gate_opens() {
    use std::sync::atomic::Ordering;

    let (two, held) = two_then_held();
    let names = sixteen();
    let (mine, theirs): (Vec<&str>, Vec<&str>) = names
        .iter()
        .map(String::as_str)
        .partition(|n| !theirs_on(&two, n));
    assert!(mine.len() >= 2 && theirs.len() >= 2, "{mine:?} {theirs:?}");
    let all: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 5)).collect();
    let (slice_tx, slice) = watch::channel(Arc::new(two.clone()));
    let mut api = Scripted::subscribed_on(ListMode::Paged, None, slice);
    api.next().await.list(10, &all);
    let stream = api.next().await.open();
    let mine_delivered: Vec<(&str, bool)> = mine.iter().map(|n| (*n, false)).collect();
    assert_eq!(api.delivered(), named(&mine_delivered));

    // d1 dies: its keys are d0's on its ring, held until the handover completes.
    let died = tokio::time::Instant::now();
    slice_tx.send_replace(Arc::new(held));
    let beside = api.next().await;
    assert_eq!(
        beside.at - died,
        crate::watch::task::HELD_LIST_AFTER,
        "listed once the handover has held them that long"
    );
    assert!(
        beside.is_paged_list(),
        "a list to index them: {:?}",
        beside.query
    );
    assert!(
        api.children.shows_everything(),
        "readers of children are not told a list runs: it hands nothing out"
    );
    beside.list(12, &all);
    let group = api.member.group.clone();
    until("the held keys are indexed", || {
        group.figures().held_keys == theirs.len()
    })
    .await;
    assert_eq!(api.delivered(), [], "held: nothing handed out");

    // The watch cannot resume, and one held key is deleted meanwhile.
    let gone = theirs[0];
    let after: Vec<(&str, u64)> = all.iter().copied().filter(|(n, _)| *n != gone).collect();
    stream.gone();
    let again = api.next().await;
    assert!(again.is_paged_list(), "listed again: {:?}", again.query);
    again.list(20, &after);
    let _resumed = api.next().await.open();
    until("the re-list's sweep holds the deletion", || {
        group.figures().held == 1
    })
    .await;
    assert_eq!(api.delivered(), [], "still held");

    gate_opens(&slice_tx, &mut api).await.list(22, &after);
    let mut got = Vec::new();
    while got.len() < theirs.len() {
        api.member.woken().await;
        got.extend(api.delivered());
    }
    got.sort();
    let mut want: Vec<(&str, bool)> = theirs.iter().map(|n| (*n, *n == gone)).collect();
    want.sort_unstable();
    assert_eq!(got, named(&want));
    assert_eq!(group.figures().held_keys, 0);
    assert_eq!(api.counts.side_lists.load(Ordering::Relaxed), 2);
}

/// A handover that completes soon after the ring gave this dispatcher keys (a member drained
/// and left) lists beside the stream once, as its gate opens: no list to index the keys it held
/// for that moment.
#[tokio::test(start_paused = true)]
async fn a_handover_that_completes_at_once_lists_only_as_its_gate_opens() {
    use std::sync::atomic::Ordering;

    let (two, held) = two_then_held();
    let (slice_tx, slice) = watch::channel(Arc::new(two));
    let mut api = Scripted::subscribed_on(ListMode::Paged, None, slice);
    api.next().await.list(10, &[("a", 5), ("b", 6)]);
    let _stream = api.next().await.open();
    slice_tx.send_replace(Arc::new(held));
    tokio::time::sleep(crate::watch::task::HELD_LIST_AFTER / 2).await;
    gate_opens(&slice_tx, &mut api)
        .await
        .list(12, &[("a", 5), ("b", 6)]);
    assert!(api.api.asks_nothing_more().await, "no other list");
    assert_eq!(api.counts.side_lists.load(Ordering::Relaxed), 1);
}

/// The ring gives this dispatcher keys while its watch's own list runs (a re-list after 410
/// Gone, as after an API-server restart, when deaths are often found too): the keys that list
/// showed before were not held then, so the list that indexes the held keys reaches up to where
/// the own list had got, and the own list shows the rest. Every held key ends up indexed.
#[tokio::test(start_paused = true)]
async fn a_ring_change_during_the_watchs_own_list_indexes_what_that_list_showed_before_it() {
    let (two, held) = two_then_held();
    let theirs_on_two = |name: &str| theirs_on(&two, name);
    let names = sixteen();
    let all: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 5)).collect();
    let theirs = names.iter().filter(|n| theirs_on_two(n)).count();
    let (first, rest) = all.split_at(8);
    assert!(
        first.iter().any(|(n, _)| theirs_on_two(n)) && rest.iter().any(|(n, _)| theirs_on_two(n)),
        "dispatcher-1 owns keys in both halves"
    );
    let (slice_tx, slice) = watch::channel(Arc::new(two.clone()));
    let mut api = Scripted::subscribed_on(ListMode::Paged, None, slice);
    api.next().await.list(10, &all);
    let stream = api.next().await.open();
    stream.gone();
    let again = api.next().await;
    assert!(again.is_paged_list(), "listed again: {:?}", again.query);
    again.list_page(20, first, "more");
    let rest_asked = api.next().await;
    assert_eq!(rest_asked.param("continue"), Some("more"));
    // d1 dies while the re-list runs.
    slice_tx.send_replace(Arc::new(held));
    let beside = api.next().await;
    assert!(
        beside.is_paged_list(),
        "a list to index them: {:?}",
        beside.query
    );
    assert_eq!(beside.param("continue"), None);
    beside.list(21, &all);
    rest_asked.list(20, rest);
    let group = api.member.group.clone();
    until("every held key is indexed", || {
        group.figures().held_keys == theirs
    })
    .await;
    let resumed = api.next().await;
    assert!(resumed.watch, "the watch resumes: {:?}", resumed.query);
    assert_eq!(group.figures().held, 0, "nothing taken for deleted");
}

/// d0's slice on a ring of d0 and d1, and its slice once d1 died: d1's keys are d0's, held
/// until the handover completes.
fn two_then_held() -> (Slice, Slice) {
    let two = Slice::fixed("d0", Ring::new(["d0", "d1"]));
    let mut held = Slice::fixed("d0", Ring::new(["d0"]));
    held.settled = Some(two.ring.clone());
    (two, held)
}

/// Whether d1 owns the ConfigMap `name` of namespace `ns` on `two`'s ring.
fn theirs_on(two: &Slice, name: &str) -> bool {
    let key = kube_dispatch_proto::RequestKey::new("", "ConfigMap", "ns", name).to_string();
    two.owned_elsewhere(KeyRef::new(&key))
}

/// Sixteen ConfigMap names, in the order a list shows them.
fn sixteen() -> Vec<String> {
    (0..16).map(|i| format!("o{i:02}")).collect()
}

/// The handover completes: d0 serves the ring of one, and its watch lists beside its stream
/// for the keys it now serves; that list's request.
async fn gate_opens(slice_tx: &watch::Sender<Arc<Slice>>, api: &mut Scripted) -> Asked {
    slice_tx.send_replace(Arc::new(Slice::fixed("d0", Ring::new(["d0"]))));
    let opening = api.next().await;
    assert!(
        opening.is_paged_list(),
        "the gate's list: {:?}",
        opening.query
    );
    opening
}
