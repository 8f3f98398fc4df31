use proptest::prelude::*;

use super::*;

const OBJ: (&str, &str) = ("uid", "1");

impl Children {
    /// Panics unless both directions hold the same children and the bytes add up.
    fn check(&self) {
        for k in self.by_kind.values() {
            let mut inverse: HashMap<&str, Vec<&str>> = HashMap::new();
            let mut bytes = 0;
            for (key, c) in &k.by_child {
                inverse.entry(&c.owner).or_default().push(key);
                bytes += entry_bytes(key, c);
            }
            bytes += k.by_owner.keys().map(|o| o.len()).sum::<usize>();
            assert_eq!(k.bytes, bytes, "the bytes kept as the index changed");
            assert_eq!(inverse.len(), k.by_owner.len(), "no owner without children");
            for (owner, mut keys) in inverse {
                keys.sort_unstable();
                let known: Vec<&str> = k.by_owner[owner].keys().map(|k| &**k).collect();
                assert_eq!(keys, known, "children of {owner}");
            }
        }
    }
}

fn kind() -> OwnerKind {
    OwnerKind {
        group: "apps".into(),
        version: "v1".into(),
        kind: "Deployment".into(),
        namespaced: true,
    }
}

#[test]
fn an_owner_that_loses_a_child_is_told() {
    let mut c = Children::default();
    let k = kind();
    assert_eq!(c.seen(&k, "rs-1", Some("a".into()), 1, false, OBJ), ["a"]);
    assert_eq!(c.seen(&k, "rs-1", Some("a".into()), 1, false, OBJ), ["a"]);
    // Adopted by b: both hear of it.
    assert_eq!(
        c.seen(&k, "rs-1", Some("b".into()), 1, false, OBJ),
        ["b", "a"]
    );
    // Orphaned: b, which lost it, hears; deleted afterwards: nobody is left to tell.
    assert_eq!(c.seen(&k, "rs-1", None, 1, false, OBJ), ["b"]);
    assert!(c.seen(&k, "rs-1", None, 1, true, OBJ).is_empty());
    assert_eq!(c.len(), 0);
}

#[test]
fn a_list_beside_the_watch_never_overrides_it() {
    let mut c = Children::default();
    let k = kind();
    c.seen(&k, "rs-1", Some("b".into()), 1, false, OBJ);
    c.listed(&k, "rs-1", "a".into(), 1, OBJ);
    // Deleted: b, which the watch knew, is told, not the list's a.
    assert_eq!(c.seen(&k, "rs-1", Some("b".into()), 1, true, OBJ), ["b"]);
    c.seen(&k, "rs-2", Some("b".into()), 1, false, OBJ);
    c.listed(&k, "rs-2", "a".into(), 1, OBJ);
    assert_eq!(c.seen(&k, "rs-2", None, 1, false, OBJ), ["b"]);
}

#[test]
fn a_relist_tells_the_owners_of_children_it_did_not_show() {
    let mut c = Children::default();
    let k = kind();
    for (child, owner) in [("rs-1", "a"), ("rs-2", "a"), ("rs-3", "b"), ("rs-4", "c")] {
        c.seen(&k, child, Some(owner.into()), 1, false, OBJ);
    }
    // The re-list of epoch 2 shows rs-3 only.
    c.seen(&k, "rs-3", Some("b".into()), 2, false, OBJ);
    let told = c.swept(2, |_| true);
    assert_eq!(told[&k], ["a", "c"]);
    assert_eq!(c.len(), 1);
    // A kind nobody subscribes to any more is forgotten.
    assert!(c.swept(2, |_| false).is_empty());
    assert_eq!(c.len(), 0);
}

#[test]
fn an_owner_is_told_its_children_with_their_uids_and_versions() {
    let mut c = Children::default();
    let k = kind();
    c.seen(&k, "rs-2", Some("a".into()), 1, false, ("u2", "7"));
    c.seen(&k, "rs-1", Some("a".into()), 1, false, ("u1", "5"));
    c.seen(&k, "rs-3", Some("b".into()), 1, false, ("u3", "6"));
    c.seen(&k, "rs-1", Some("a".into()), 1, false, ("u1", "9"));
    let of_a: Vec<(String, String, String)> = c
        .of(&k, "a")
        .into_iter()
        .map(|k| {
            (
                k.key.to_string(),
                k.uid.to_string(),
                k.resource_version.to_string(),
            )
        })
        .collect();
    assert_eq!(
        of_a,
        [
            ("rs-1".into(), "u1".into(), "9".into()),
            ("rs-2".into(), "u2".into(), "7".into())
        ]
    );
    // Adopted by b: a no longer has it.
    c.seen(&k, "rs-2", Some("b".into()), 1, false, ("u2", "8"));
    assert_eq!(c.of(&k, "a").len(), 1);
    assert_eq!(c.of(&k, "b").len(), 2);
    assert!(c.of(&k, "nobody").is_empty());
    c.check();
}

#[test]
fn bodies_are_kept_only_once_asked_and_given_back_with_their_children() {
    let pool = BodyPool::new(1000);
    let index = ChildIndex::default();
    let k = kind();
    let shown = |uid: &'static str, version: &'static str, json: &str| Shown {
        uid,
        resource_version: version,
        body: index.hold(|| Some(Arc::from(json.as_bytes()))),
    };
    // Seen by the watch's stream, owned by "a".
    let see = |child: &str, uid: &'static str, version: &'static str, json: &str| {
        let shown = shown(uid, version, json);
        index
            .write()
            .seen(&k, child, Some("a".into()), 1, false, shown);
    };
    assert!(
        index.hold(|| unreachable!("no body is made")).is_none(),
        "an index nobody asked keeps none"
    );
    index.keep_bodies(&pool);
    see("cm-1", "u1", "1", r#"{"v":"1"}"#);
    let listed = shown("u2", "2", r#"{"v":"2"}"#);
    index.write().listed(&k, "cm-2", "a".into(), 1, listed);
    assert_eq!(pool.used(), 18);
    let of = index.read().of(&k, "a");
    assert_eq!(of[0].body.as_deref(), Some(&br#"{"v":"1"}"#[..]));
    assert_eq!(of[1].body.as_deref(), Some(&br#"{"v":"2"}"#[..]));
    // A change replaces the body; a deletion, a lost owner and a forgotten kind give theirs back.
    see("cm-1", "u1", "10", r#"{"v":"10"}"#);
    assert_eq!(pool.used(), 19);
    index.write().seen(&k, "cm-1", None, 1, true, ("u1", "11"));
    assert_eq!(pool.used(), 9);
    index.write().retain_owners(|_| false);
    assert_eq!(pool.used(), 0);
    see("cm-3", "u3", "1", "{}");
    index.write().forget(&k);
    assert_eq!(pool.used(), 0);
    // Past half the pool, children are indexed without bodies.
    assert!(index.hold(|| Some(vec![0; 501].into())).is_none());
    see("cm-4", "u4", "1", "{}");
    // Indexed before bodies were kept: a list at that very version brings the body, an
    // older or newer one does not.
    index
        .write()
        .seen(&k, "cm-5", Some("a".into()), 1, false, ("u5", "7"));
    let listed = shown("u5", "6", "{6}");
    index.write().listed(&k, "cm-5", "a".into(), 1, listed);
    let listed = shown("u5", "7", "{7}");
    index.write().listed(&k, "cm-5", "a".into(), 1, listed);
    let cm5 = index
        .read()
        .of(&k, "a")
        .into_iter()
        .find(|c| &*c.key == "cm-5");
    assert_eq!(cm5.and_then(|c| c.body).as_deref(), Some(&b"{7}"[..]));
    drop(index);
    assert_eq!(pool.used(), 0, "dropped with the watch");
}

#[test]
fn while_a_list_beside_the_watch_runs_the_owners_served_throughout_have_complete_children() {
    let index = ChildIndex::default();
    let k = kind();
    let ring = |members: &[&str]| {
        Arc::new(Slice::fixed(
            "d0",
            kube_dispatch_proto::Ring::new(members.iter().copied()),
        ))
    };
    let (two, alone) = (ring(&["d0", "d1"]), ring(&["d0"]));
    let owners: Vec<String> = (0..64)
        .map(|i| format!("apps/Deployment/ns/o{i}"))
        .collect();
    let served = |o: &&String| two.may_serve(KeyRef::new(o));
    let mine = owners.iter().find(served).expect("an owner d0 serves");
    let theirs = owners
        .iter()
        .find(|o| !served(o))
        .expect("an owner d1 serves");
    let complete = |owner: &str| index.of(&k, owner).complete;
    assert!(!complete(mine), "its own list has not run yet");
    index.follow(two.clone());
    index.own_list_running(false);
    assert!(complete(mine));
    assert!(
        !complete(theirs),
        "served elsewhere: its children are not kept here"
    );
    // d1 leaves: d0 serves more, and lists beside its watch for the owners it gained.
    index.list_beside_for_more_owners();
    assert!(
        complete(mine),
        "the index has not taken the new slice in yet"
    );
    index.follow(alone.clone());
    assert!(complete(mine), "kept all along");
    assert!(!complete(theirs), "its children are being listed");
    // Another change while that list runs: what neither slice served is still missing.
    index.list_beside_for_more_owners();
    index.follow(alone.clone());
    assert!(complete(mine));
    assert!(!complete(theirs));
    index.side_list_running(false);
    assert!(complete(theirs), "listed");
    // A group joins the watch: nothing is complete until the list for it ends.
    index.joined();
    assert!(!complete(mine));
    index.joins_taken();
    assert!(!complete(mine));
    index.side_list_running(false);
    assert!(complete(mine));
    // A list beside the watch spanning more changes than it keeps track of: none complete
    // until it ends, whatever changes come after.
    for _ in 0..=HELD_THROUGH {
        index.list_beside_for_more_owners();
    }
    assert!(!complete(mine));
    index.list_beside_for_more_owners();
    assert!(!complete(mine), "still within that list");
    index.side_list_running(false);
    assert!(complete(mine));
    // The same after a group joined: a change while its list runs completes nobody.
    index.joined();
    index.joins_taken();
    index.list_beside_for_more_owners();
    assert!(!complete(mine), "the joined group's list is still running");
    index.side_list_running(false);
    // The stream broken, or listing again: none complete.
    index.own_list_running(true);
    assert!(!complete(mine));
}

/// A member joins: the owners that move to it are still delivered here until this dispatcher
/// releases the ring, and their requests show their children complete, as the index kept them
/// through the slice whose settled ring caught up; they are forgotten once nothing is on its
/// way out (`forget_kept`) or the ring changes. Never on a ring keyed by namespace, whose watch
/// stops showing the namespaces that moved.
#[test]
fn the_children_of_owners_moving_to_a_member_that_joined_are_kept_until_released() {
    use kube_dispatch_proto::{Ring, RingKey};
    let k = kind();
    for by in [RingKey::Name, RingKey::Namespace] {
        let index = ChildIndex::default();
        let slice = |members: &[&str], settled: &[&str]| {
            let mut slice = Slice::fixed("d0", Ring::with_key(members.iter().copied(), by));
            slice.settled = Some(Arc::new(Ring::with_key(settled.iter().copied(), by)));
            Arc::new(slice)
        };
        let alone = slice(&["d0"], &["d0"]);
        let joining = slice(&["d0", "d1"], &["d0"]);
        let joined = slice(&["d0", "d1"], &["d0", "d1"]);
        let moving = (0..64)
            .map(|i| format!("apps/Deployment/ns{i}/o"))
            .find(|o| !joined.may_serve(KeyRef::new(o)))
            .expect("an owner that moves to d1");
        index.follow(alone.clone());
        index.own_list_running(false);
        let child = format!("apps/ReplicaSet/{}/rs", &moving[16..]);
        index
            .write()
            .seen(&k, &child, Some(moving.clone()), 1, false, OBJ);
        let of = |index: &ChildIndex| {
            let of = index.of(&k, &moving);
            (of.children.len(), of.complete)
        };
        assert_eq!(of(&index), (1, true));
        let kept = index.follow(joining);
        assert_eq!(
            kept.is_some(),
            by == RingKey::Name,
            "kept when a member joins"
        );
        if by == RingKey::Namespace {
            assert!(!of(&index).1, "its namespace is no longer watched here");
            assert!(index.follow(joined).is_none());
            assert_eq!(of(&index), (0, false));
            continue;
        }
        assert_eq!(of(&index), (1, true), "the settled ring still serves it");
        assert!(index.follow(joined.clone()).is_some());
        assert_eq!(
            of(&index),
            (1, true),
            "kept while it may still be delivered here"
        );
        assert!(
            index.follow(joined.clone()).is_some(),
            "the ring has not changed"
        );
        assert_eq!(of(&index), (1, true));
        index.forget_kept();
        assert_eq!(
            of(&index),
            (0, false),
            "forgotten once nothing is on its way out"
        );
        index.follow(joined.clone());
        assert_eq!(
            of(&index),
            (0, false),
            "the slice before serves it no more either"
        );
        // A member leaves: nothing moves away, nothing is kept; the keys served here grow, and
        // the watch lists beside its stream (marked before it follows the slice).
        index.list_beside_for_more_owners();
        assert!(index.follow(alone.clone()).is_none(), "a member left");
        index.side_list_running(false);
        // The watch may see a join as one slice: kept the same.
        index
            .write()
            .seen(&k, &child, Some(moving.clone()), 1, false, OBJ);
        assert!(index.follow(joined).is_some());
        assert_eq!(of(&index), (1, true), "a join seen as one slice");
    }
}

#[test]
fn a_request_too_small_for_the_bodies_leaves_out_the_last_ones_first() {
    let child = |name: &str, body: usize| KnownChild {
        key: Arc::from(name),
        uid: "u".into(),
        resource_version: "1".into(),
        body: Some(vec![b'x'; body].into()),
    };
    let mut of = OwnerChildren {
        children: vec![child("a", 100), child("b", 100), child("c", 100)],
        complete: true,
        truncated: false,
    };
    let all = of.wire_bound();
    of.fit(all - 1);
    assert!(of.children[..2].iter().all(|c| c.body.is_some()));
    assert!(of.children[2].body.is_none());
    assert!(!of.truncated, "every child is still listed");
    of.fit(all - 250);
    assert_eq!(
        of.children.iter().filter(|c| c.body.is_some()).count(),
        0,
        "{of:?}"
    );
    assert_eq!(of.children.len(), 3);
    of.fit(1);
    assert!(of.truncated && of.children.is_empty());
}

/// What the index may be told, for the property below.
#[derive(Clone, Debug)]
enum Step {
    Seen {
        child: u8,
        owner: Option<u8>,
        deleted: bool,
        rv: u8,
    },
    Listed {
        child: u8,
        owner: u8,
    },
    Swept,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..12u8, proptest::option::of(0..4u8), any::<bool>(), any::<u8>())
            .prop_map(|(child, owner, deleted, rv)| Step::Seen { child, owner, deleted, rv }),
        2 => (0..12u8, 0..4u8).prop_map(|(child, owner)| Step::Listed { child, owner }),
        1 => Just(Step::Swept),
    ]
}

proptest! {
    /// Whatever the watch shows, in any order, each child is under exactly the owner it was
    /// last seen with, each owner lists exactly its children, and the bytes add up.
    #[test]
    fn both_directions_always_agree(steps in proptest::collection::vec(step(), 0..80)) {
        let mut c = Children::default();
        let k = kind();
        let mut epoch = 1;
        for step in steps {
            match step {
                Step::Seen { child, owner, deleted, rv } => {
                    let rv = rv.to_string();
                    c.seen(&k, &format!("c{child}"), owner.map(|o| format!("o{o}")), epoch, deleted, ("u", rv.as_str()));
                }
                Step::Listed { child, owner } => {
                    c.listed(&k, &format!("c{child}"), format!("o{owner}"), epoch, OBJ);
                }
                Step::Swept => {
                    epoch += 1;
                    c.swept(epoch, |_| true);
                }
            }
            c.check();
        }
        let listed: usize = (0..4).map(|o| c.of(&k, &format!("o{o}")).len()).sum();
        prop_assert_eq!(listed, c.len());
    }
}

/// A member leaves while its handover is pending: this dispatcher may serve the owners it had
/// from then on, and indexes their children that change, but no list shows the others until the
/// handover completes and a list beside the watch runs. Those owners are complete only once a
/// list marked after they grew has ended: not the list beside that was running already, nor
/// one that began before. Owners held all along stay complete throughout.
#[test]
fn owners_gained_without_a_list_are_complete_only_once_a_list_marked_since_ends() {
    use kube_dispatch_proto::Ring;

    let index = ChildIndex::default();
    let k = kind();
    let slice = |ring: &[&str], settled: &[&str]| {
        let mut s = Slice::fixed("d0", Ring::new(ring.iter().copied()));
        s.settled = Some(Arc::new(Ring::new(settled.iter().copied())));
        Arc::new(s)
    };
    let both = slice(&["d0", "d1"], &["d0", "d1"]);
    let pending = slice(&["d0"], &["d0", "d1"]);
    let alone = slice(&["d0"], &["d0"]);
    let owners: Vec<String> = (0..64)
        .map(|i| format!("apps/Deployment/ns/o{i}"))
        .collect();
    let served = |o: &&String| both.may_serve(KeyRef::new(o));
    let mine = owners.iter().find(served).expect("an owner d0 serves");
    let theirs = owners.iter().find(|o| !served(o)).expect("one d1 serves");
    let complete = |owner: &str| index.of(&k, owner).complete;
    let step = || index.step_done(Instant::now());
    index.follow(both.clone());
    index.own_list(false);
    index.own_list_running(false);
    step();
    assert!(complete(mine) && !complete(theirs));

    // A list beside the watch for another reason is running when d1 leaves.
    index.list_beside_for_more_owners();
    index.follow(both.clone());
    step();
    index.follow(pending.clone());
    step();
    assert!(complete(mine), "held all along");
    assert!(!complete(theirs), "its older children were never listed");
    index.side_list_running(false);
    step();
    assert!(!complete(theirs), "that list began before it was gained");

    // The handover completes: the list beside it shows them.
    index.list_beside_for_more_owners();
    index.follow(alone.clone());
    index.side_list_running(true);
    step();
    assert!(!complete(theirs), "being listed");
    assert!(complete(mine));
    index.side_list_running(false);
    step();
    assert!(complete(theirs), "listed since");

    // Gained while the watch's own list ran (a re-list begun before the growth): still not
    // complete when that list ends.
    index.follow(both.clone());
    index.forget_kept();
    step();
    assert!(!complete(theirs), "d1's again");
    index.own_list(true);
    index.own_list_running(true);
    step();
    index.follow(pending.clone());
    step();
    index.own_list(false);
    index.own_list_running(false);
    step();
    assert!(!complete(theirs), "the re-list began before it was gained");
    assert!(complete(mine));
    // A stream that breaks and resumes where it was lists nothing.
    index.own_list_running(true);
    step();
    index.own_list_running(false);
    assert!(
        !complete(theirs),
        "a broken stream resumed showed no object again"
    );
    index.own_list(true);
    index.own_list(false);
    assert!(complete(theirs), "a re-list begun since showed them");
}

/// Members that die one after the other before the next list (each death its own ring change):
/// the owners held all along stay complete however many there are; those gained are not.
#[test]
fn a_chain_of_deaths_before_a_list_keeps_the_owners_held_all_along_complete() {
    use kube_dispatch_proto::Ring;

    let index = ChildIndex::default();
    let k = kind();
    let members = ["d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"];
    let slice = |alive: usize| {
        let mut s = Slice::fixed("d0", Ring::new(members[..alive].iter().copied()));
        s.settled = Some(Arc::new(Ring::new(members.iter().copied())));
        Arc::new(s)
    };
    let all = Arc::new(Slice::fixed("d0", Ring::new(members.iter().copied())));
    let owners: Vec<String> = (0..256)
        .map(|i| format!("apps/Deployment/ns/o{i}"))
        .collect();
    let mine = owners
        .iter()
        .find(|o| all.may_serve(KeyRef::new(o)))
        .expect("an owner d0 serves");
    let gained = owners
        .iter()
        .find(|o| !all.may_serve(KeyRef::new(o)) && slice(1).may_serve(KeyRef::new(o)))
        .expect("an owner d0 gains");
    index.follow(all.clone());
    index.own_list(false);
    index.own_list_running(false);
    index.step_done(Instant::now());
    for alive in (1..members.len()).rev() {
        index.follow(slice(alive));
        index.step_done(Instant::now());
    }
    let complete = |owner: &str| index.of(&k, owner).complete;
    assert!(complete(mine), "held all along, through 7 deaths");
    assert!(!complete(gained));
}
