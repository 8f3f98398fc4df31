use super::*;

/// The address of dispatcher `d{i}` of [`dispatchers`].
fn address(i: usize) -> String {
    format!("10.0.0.{i}:7070")
}

fn dispatchers(n: usize) -> BTreeMap<String, String> {
    (0..n).map(|i| (format!("d{i}"), address(i))).collect()
}

#[test]
fn replicas_are_told_their_dispatchers_and_every_change() {
    let registry = Registry::new(10, 10, GroupOwners::default());
    registry.set_dispatchers(dispatchers(3));
    let (mut a, _ga) = registry.register("g", "a", None, &[]).unwrap();
    assert_eq!(a.borrow_and_update().dispatchers.len(), 3);
    let (mut b, gb) = registry.register("g", "b", None, &[]).unwrap();
    assert!(a.has_changed().unwrap(), "a gives up a dispatcher to b");
    let (na, nb) = (
        a.borrow_and_update().dispatchers.len(),
        b.borrow_and_update().dispatchers.len(),
    );
    assert_eq!((na.min(nb), na.max(nb)), (1, 2));
    // b's stream ends: b keeps its place for the grace, then a takes everything again.
    drop(gb);
    let now = Instant::now();
    registry.expire(now, Duration::from_secs(5));
    assert!(!a.has_changed().unwrap());
    registry.expire(now + Duration::from_secs(5), Duration::from_secs(5));
    assert_eq!(a.borrow_and_update().dispatchers.len(), 3);
    assert_eq!(registry.len(), 1);
    assert!(b.has_changed().is_err(), "b's assignment is dropped");
}

/// A new leader settles: replicas that register saying what they poll are placed there
/// once it ends, whatever order they came back in, and nothing moves; a replica that says
/// nothing is placed by the rules.
#[test]
fn a_new_leader_places_returning_replicas_where_they_were() {
    // Placed from scratch, "a" would poll d0 and d2 and "b" d1; under the old leader "a"
    // polled d1 and "b" d0 and d2.
    let registry = Registry::new(10, 10, GroupOwners::default());
    registry.set_dispatchers(dispatchers(3));
    registry.settle();
    let (mut b, _gb) = registry
        .register("g", "b", None, &[address(0), address(2)])
        .unwrap();
    let (mut a, _ga) = registry.register("g", "a", None, &[address(1)]).unwrap();
    assert_eq!(a.borrow_and_update().generation, 0, "nothing placed yet");
    registry.settled();
    assert_eq!(a.borrow_and_update().dispatchers, [address(1)]);
    assert_eq!(b.borrow_and_update().dispatchers, [address(0), address(2)]);
    assert_eq!(registry.figures().moves, 0);
    // A third replica, saying nothing, is placed as the rules say: it takes one of b's.
    let (mut c, _gc) = registry.register("g", "c", None, &[]).unwrap();
    assert_eq!(c.borrow_and_update().dispatchers.len(), 1);
    assert_eq!(b.borrow_and_update().dispatchers.len(), 1);
    assert_eq!(a.borrow_and_update().dispatchers, [address(1)]);
}

/// During a settle, a group none of whose replicas said it polls a dispatcher has nothing
/// to keep: its replicas are placed at once (also once the dispatchers become known). A
/// group whose replica came back saying what it polls waits for the settle's end, its new
/// replica too.
#[test]
fn a_new_group_is_placed_at_once_during_a_settle() {
    let registry = Registry::new(10, 10, GroupOwners::default());
    registry.settle();
    let (mut n, _gn) = registry.register("new", "n", None, &[]).unwrap();
    assert_eq!(n.borrow_and_update().generation, 0, "no dispatcher known");
    registry.set_dispatchers(dispatchers(3));
    let got = n.borrow_and_update().clone();
    assert_eq!((got.generation, got.dispatchers.len()), (1, 3));
    let (mut o, _go) = registry.register("new", "o", None, &[]).unwrap();
    let (n_now, o_now) = (n.borrow_and_update().clone(), o.borrow_and_update().clone());
    assert_eq!(o_now.generation, 1, "a second new replica at once too");
    assert_eq!(
        n_now.dispatchers.len() + o_now.dispatchers.len(),
        3,
        "they share"
    );

    let (mut r, _gr) = registry.register("back", "r", None, &[address(1)]).unwrap();
    let (mut m, _gm) = registry.register("back", "m", None, &[]).unwrap();
    assert_eq!(r.borrow_and_update().generation, 0, "placed at the end");
    assert_eq!(m.borrow_and_update().generation, 0, "placed at the end");
    registry.settled();
    let (r, m) = (r.borrow_and_update().clone(), m.borrow_and_update().clone());
    assert!(r.dispatchers.contains(&address(1)), "r stays: {r:?}");
    assert!(!m.dispatchers.is_empty(), "{m:?}");
    assert_eq!(r.dispatchers.len() + m.dispatchers.len(), 3, "{r:?} {m:?}");
    assert!(!n.has_changed().unwrap(), "the new group stays where it is");
    assert!(!o.has_changed().unwrap(), "the new group stays where it is");
}

/// A leader whose settle ends before it knows the dispatchers (its Lease watch has not
/// listed) keeps settling until it does: an empty assignment would have the replicas close
/// every session.
#[test]
fn a_settle_lasts_until_the_dispatchers_are_known() {
    let registry = Registry::new(10, 10, GroupOwners::default());
    registry.settle();
    let (mut a, _ga) = registry.register("g", "a", None, &[address(1)]).unwrap();
    registry.settled();
    assert_eq!(a.borrow_and_update().generation, 0, "nothing placed yet");
    registry.set_dispatchers(dispatchers(2));
    let got = a.borrow_and_update().clone();
    assert_eq!(got.generation, 1);
    assert_eq!(got.dispatchers.len(), 2);
}

/// A dispatcher that joins during the settle is polled at once: the settle ends, and the
/// replicas back by then are placed where they are, the new dispatcher given by the rules.
#[test]
fn a_dispatcher_joining_during_a_settle_ends_it() {
    let registry = Registry::new(10, 10, GroupOwners::default());
    registry.set_dispatchers(dispatchers(2));
    registry.settle();
    let (mut a, _ga) = registry.register("g", "a", None, &[address(1)]).unwrap();
    let (mut b, _gb) = registry.register("g", "b", None, &[address(0)]).unwrap();
    assert_eq!(a.borrow_and_update().generation, 0, "nothing placed yet");
    registry.set_dispatchers(dispatchers(3));
    let (a, b) = (a.borrow_and_update().clone(), b.borrow_and_update().clone());
    assert!(a.dispatchers.contains(&address(1)), "{a:?}");
    assert!(b.dispatchers.contains(&address(0)), "{b:?}");
    assert_eq!(a.dispatchers.len() + b.dispatchers.len(), 3, "d2 is polled");
}

#[test]
fn a_replica_that_leaves_hands_its_dispatchers_over_at_once() {
    let registry = Registry::new(10, 10, GroupOwners::default());
    registry.set_dispatchers(dispatchers(3));
    let (mut a, _ga) = registry.register("g", "a", None, &[]).unwrap();
    let (b, gb) = registry.register("g", "b", None, &[]).unwrap();
    a.borrow_and_update();
    assert!(registry.leave("g", "b", None).unwrap());
    // No grace: a polls all three dispatchers now, while b's stream is still open.
    assert_eq!(a.borrow_and_update().dispatchers.len(), 3);
    assert!(
        b.has_changed().is_err(),
        "b's assignment is dropped, so its stream ends"
    );
    assert_eq!(registry.len(), 1);
    assert!(!registry.leave("g", "b", None).unwrap(), "gone already");
    assert!(
        !registry.leave("other", "b", None).unwrap(),
        "no such group"
    );
    // Back under the same id (a restarted pod) before its old stream is seen to end: the
    // old stream ending must not count against the new registration.
    let (_b2, _gb2) = registry.register("g", "b", None, &[]).unwrap();
    drop(gb);
    registry.expire(
        Instant::now() + Duration::from_secs(60),
        Duration::from_secs(5),
    );
    assert_eq!(registry.len(), 2, "b's new registration stays");
    assert_eq!(a.borrow_and_update().dispatchers.len(), 2);
}

#[test]
fn figures_count_replicas_assignments_and_moves() {
    let registry = Registry::new(10, 10, GroupOwners::default());
    registry.set_dispatchers(dispatchers(2));
    let (_a, _ga) = registry.register("g", "a", None, &[]).unwrap();
    let (_b, _gb) = registry.register("g", "b", None, &[]).unwrap();
    let before = registry.figures();
    assert_eq!(
        (before.replicas, before.groups, before.dispatchers),
        (2, 1, 2)
    );
    // A third dispatcher: someone's dispatchers change.
    registry.set_dispatchers(dispatchers(3));
    let after = registry.figures();
    assert!(after.assignments > before.assignments);
    assert!(after.moves > before.moves);
}

#[test]
fn a_reconnect_within_the_grace_moves_nothing() {
    let registry = Registry::new(10, 10, GroupOwners::default());
    registry.set_dispatchers(dispatchers(2));
    let (_a, ga) = registry.register("g", "a", None, &[]).unwrap();
    let (_b, _gb) = registry.register("g", "b", None, &[]).unwrap();
    let before = registry.placements();
    drop(ga);
    let (mut again, _ga) = registry.register("g", "a", None, &[]).unwrap();
    registry.expire(
        Instant::now() + Duration::from_secs(60),
        Duration::from_secs(5),
    );
    assert_eq!(registry.placements(), before);
    assert_eq!(again.borrow_and_update().dispatchers.len(), 1);
}

#[test]
fn registrations_are_bounded() {
    let registry = Registry::new(2, 2, GroupOwners::default());
    let _a = registry.register("g", "a", None, &[]).unwrap();
    let _b = registry.register("h", "b", None, &[]).unwrap();
    assert_eq!(
        registry.register("g", "c", None, &[]).unwrap_err(),
        RegisterError::Full(2)
    );
    // Another stream of a known replica is not a new registration.
    assert!(registry.register("g", "a", None, &[]).is_ok());
}

#[test]
fn a_listed_group_is_placed_for_its_listed_users_only() {
    let owners = GroupOwners::from_pairs([
        ("g".to_owned(), "team-a".to_owned()),
        ("g".to_owned(), "team-b".to_owned()),
    ]);
    let registry = Registry::new(10, 10, owners);
    assert!(registry.register("g", "c", Some("team-c"), &[]).is_err());
    let _b = registry.register("g", "b", Some("team-b"), &[]).unwrap();
    assert!(registry.register("g", "a", Some("team-a"), &[]).is_ok());
    assert!(registry.register("g", "c", Some("team-c"), &[]).is_err());
}

#[test]
fn each_user_has_groups_of_its_own() {
    let registry = Registry::new(10, 10, GroupOwners::default());
    registry.set_dispatchers(dispatchers(2));
    let (a, _ga) = registry.register("g", "r", Some("team-a"), &[]).unwrap();
    // Team B's "g" is another group: its replica of the same id moves nothing of A's.
    let (b, _gb) = registry.register("g", "r", Some("team-b"), &[]).unwrap();
    assert_eq!(registry.placements().len(), 2);
    assert_eq!(a.borrow().dispatchers.len(), 2);
    assert_eq!(b.borrow().dispatchers.len(), 2);
    // Nor can B make A's replica leave.
    assert!(!registry.leave("g", "x", Some("team-b")).unwrap());
    assert!(registry.leave("g", "r", Some("team-b")).unwrap());
    assert_eq!(a.borrow().generation, 1, "A's assignment never changed");
}

#[test]
fn registrations_are_bounded_per_identity() {
    let registry = Registry::new(10, 2, GroupOwners::default());
    let _a = registry.register("g", "a", Some("team-a"), &[]).unwrap();
    let (_b, gb) = registry.register("h", "b", Some("team-a"), &[]).unwrap();
    assert_eq!(
        registry
            .register("g", "c", Some("team-a"), &[])
            .unwrap_err(),
        RegisterError::FullForIdentity {
            user: "team-a".into(),
            max: 2
        }
    );
    assert!(
        registry.register("g", "c", Some("team-b"), &[]).is_ok(),
        "others are not held"
    );
    // A replica that goes frees its place.
    drop(gb);
    registry.expire(
        Instant::now() + Duration::from_secs(60),
        Duration::from_secs(1),
    );
    assert!(registry.register("g", "c", Some("team-a"), &[]).is_ok());
}

#[test]
fn in_a_listed_group_a_replica_id_stays_its_registrants() {
    let owners = GroupOwners::from_pairs([
        ("g".to_owned(), "team-a".to_owned()),
        ("g".to_owned(), "team-b".to_owned()),
    ]);
    let registry = Registry::new(10, 10, owners);
    let _a = registry.register("g", "r", Some("team-a"), &[]).unwrap();
    assert!(matches!(
        registry
            .register("g", "r", Some("team-b"), &[])
            .unwrap_err(),
        RegisterError::ReplicaOfAnother { .. }
    ));
    assert!(!registry.leave("g", "r", Some("team-b")).unwrap());
    assert!(registry.leave("g", "r", Some("team-a")).unwrap());
}

#[test]
fn with_no_dispatcher_the_assignment_is_empty() {
    let registry = Registry::new(2, 2, GroupOwners::default());
    let (mut a, _g) = registry.register("g", "a", None, &[]).unwrap();
    let first = a.borrow_and_update().clone();
    assert!(first.dispatchers.is_empty());
    assert_eq!(first.generation, 1);
    registry.set_dispatchers(dispatchers(1));
    assert_eq!(a.borrow_and_update().dispatchers, ["10.0.0.0:7070"]);
}
