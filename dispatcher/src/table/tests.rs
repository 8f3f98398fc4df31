//! The group table against a scripted API server ([`crate::watch::scripted_api`]) and a paused
//! clock: sessions opened, polled, acknowledged and expired, as the gRPC service calls them.

use std::{sync::Arc, time::Duration};

use kube_dispatch_core::{
    queue::{Delivery, DeliveryId, Outcome, QueueConfig, pool::BodyPool},
    recent_deletions::RecentDeletionsConfig,
    subscription::{GroupSpec, Parts, Payload, SubscriptionSpec},
};
use kube_dispatch_server::auth::{Caller, GroupId};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{GroupTable, Opened, SessionError};
use crate::{
    config::{Limits, ListMode, Settings},
    membership::sessions::LeaseSessions,
    watch::{
        registry::{Listing, WatchError, Watches},
        scripted_api::{ApiServer, alone, config_maps, object, within},
    },
};

const TTL: Duration = Duration::from_secs(10);

/// A table of one dispatcher that serves every key, whose watches ask `api`.
fn table(cancel: &CancellationToken) -> (Arc<GroupTable>, ApiServer) {
    let (client, api) = ApiServer::start();
    let watches = Watches::new(
        client,
        alone(),
        Duration::from_secs(30),
        Listing::alone(ListMode::Paged),
        cancel.clone(),
    );
    let settings = Settings {
        identity: "d0".into(),
        limits: Limits::default(),
        queue: QueueConfig::default(),
        bodies: BodyPool::unbounded(),
        memos: BodyPool::unbounded(),
        resync_interval: Duration::ZERO,
        idle_group_grace: Duration::from_secs(30),
        status_interval: Duration::ZERO,
        max_recent_deletions: 0,
        group_owners: Default::default(),
    };
    let table = GroupTable::new(
        settings,
        watches,
        alone(),
        RecentDeletionsConfig::NONE,
        watch::channel(None).0,
        Arc::new(LeaseSessions::unlimited()),
        cancel.clone(),
    );
    (table, api)
}

fn spec() -> GroupSpec {
    GroupSpec::new(vec![SubscriptionSpec {
        watch: config_maps(),
        payload: Payload::KeyOnly,
        owner: None,
        named_by: None,
        changes_of: Parts::ALL_CHANGES,
    }])
}

/// Opens a session of `replica` in group `g`, in a task of its own: the group's first session
/// waits for its watch's list.
fn open(
    table: &Arc<GroupTable>,
    replica: &str,
) -> tokio::task::JoinHandle<Result<Opened, SessionError>> {
    let (table, replica) = (table.clone(), replica.to_owned());
    tokio::spawn(async move {
        table
            .open(
                &GroupId::shared("g"),
                &replica,
                super::Client {
                    name: "tests",
                    children_bodies: false,
                },
                &spec(),
                TTL,
                &Caller::Anonymous,
            )
            .await
    })
}

/// A poll of `session` that acknowledges `acks` and waits up to a second for keys; returns the
/// deliveries' ids and object names.
async fn poll(
    table: &GroupTable,
    session: &str,
    acks: Vec<DeliveryId>,
) -> Result<Vec<(DeliveryId, String)>, SessionError> {
    let acks = acks
        .into_iter()
        .map(|id| (id, Outcome::Success).into())
        .collect();
    let polled = within(
        "a poll ended",
        table.poll(
            session,
            &Caller::Anonymous,
            acks,
            Duration::from_secs(1),
            100,
            usize::MAX,
        ),
    )
    .await?;
    let mut got: Vec<(DeliveryId, String)> = polled
        .deliveries
        .iter()
        .map(|(d, _): &(Delivery, _)| {
            (
                d.id,
                d.key.rsplit('/').next().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    got.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(got)
}

fn names(got: &[(DeliveryId, String)]) -> Vec<&str> {
    got.iter().map(|(_, n)| n.as_str()).collect()
}

/// The first session of a group starts its watch and is handed what exists; an ack settles a
/// key, which is handed out again only when it changes.
#[tokio::test(start_paused = true)]
async fn a_first_session_is_handed_what_exists_and_then_only_what_changes() {
    let cancel = CancellationToken::new();
    let (table, mut api) = table(&cancel);
    let opening = open(&table, "r1");
    api.next().await.list(10, &[("a", 5), ("b", 6)]);
    let stream = api.next().await.open();
    let opened = within("the session opened", opening)
        .await
        .expect("joined")
        .expect("opened");
    assert!(opened.created, "the group was made for its first session");
    assert_eq!(table.watch_count(), 1);

    let got = poll(&table, &opened.session_id, vec![])
        .await
        .expect("polled");
    assert_eq!(names(&got), ["a", "b"]);
    let acks = got.iter().map(|(id, _)| *id).collect();
    stream.send("MODIFIED", object("b", 7));
    let got = poll(&table, &opened.session_id, acks)
        .await
        .expect("polled");
    assert_eq!(
        names(&got),
        ["b"],
        "only the change, once the first two were settled"
    );
    cancel.cancel();
}

/// A session whose first watch the API server refuses is not opened: the caller gets the
/// server's reason, and no group or watch is left behind.
#[tokio::test(start_paused = true)]
async fn an_open_whose_watch_is_refused_fails_with_the_reason_and_leaves_nothing() {
    let cancel = CancellationToken::new();
    let (table, mut api) = table(&cancel);
    let opening = open(&table, "r1");
    api.next()
        .await
        .refuse(403, "Forbidden", "configmaps is forbidden");
    let refused = within("the open ended", opening).await.expect("joined");
    assert!(
        matches!(
            &refused,
            Err(SessionError::Watch(WatchError::Rejected { code: 403, .. }))
        ),
        "{refused:?}"
    );
    assert_eq!(table.group_count(), 0);
    assert_eq!(table.session_count(), 0);
    assert_eq!(table.watch_count(), 0);
    cancel.cancel();
}

/// A session that is not renewed within its ttl expires: what it held in flight goes to the
/// group's other session at once, and the expired session's next call is refused.
#[tokio::test(start_paused = true)]
async fn an_expired_sessions_keys_in_flight_go_to_the_other_session() {
    let cancel = CancellationToken::new();
    let (table, mut api) = table(&cancel);
    let first = open(&table, "r1");
    let names_listed: Vec<String> = (0..8).map(|i| format!("cm-{i}")).collect();
    let objects: Vec<(&str, u64)> = names_listed.iter().map(|n| (n.as_str(), 5)).collect();
    api.next().await.list(10, &objects);
    let _stream = api.next().await.open();
    let r1 = within("r1 opened", first)
        .await
        .expect("joined")
        .expect("opened");
    let r2 = within("r2 opened", open(&table, "r2"))
        .await
        .expect("joined")
        .expect("opened");

    // Each takes its share; r1 then goes silent with its keys in flight.
    let held = poll(&table, &r1.session_id, vec![]).await.expect("polled");
    let other = poll(&table, &r2.session_id, vec![]).await.expect("polled");
    assert_eq!(held.len() + other.len(), 8, "every key handed out once");
    assert!(!held.is_empty(), "r1 holds keys: {other:?}");

    tokio::time::advance(TTL).await;
    // r2 renews by polling (with its keys settled); r1 does not.
    let renewals = other.iter().map(|(id, _)| *id).collect();
    poll(&table, &r2.session_id, renewals)
        .await
        .expect("polled");
    table.expire_sessions(Instant::now() + Duration::from_millis(1));
    assert_eq!(table.session_count(), 1);

    let taken_over = poll(&table, &r2.session_id, vec![]).await.expect("polled");
    assert_eq!(
        names(&taken_over),
        names(&held),
        "r1's keys went to r2 when r1 expired"
    );
    assert!(matches!(
        poll(&table, &r1.session_id, vec![]).await,
        Err(SessionError::Unknown { .. })
    ));
    cancel.cancel();
}

/// A session that joined a group while its first watch was starting, whose watch then failed,
/// is left in a group the table no longer holds; it still expires, and gives its slot of
/// `--max-sessions` back.
#[tokio::test(start_paused = true)]
async fn a_session_of_a_group_whose_watch_failed_still_expires() {
    let cancel = CancellationToken::new();
    let (table, mut api) = table(&cancel);
    let first = open(&table, "r1");
    let list = api.next().await;
    let second = within("r2 joined the starting group", open(&table, "r2"))
        .await
        .expect("joined")
        .expect("opened");
    assert!(!second.created);
    list.refuse(403, "Forbidden", "configmaps is forbidden");
    let refused = within("r1's open ended", first).await.expect("joined");
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(table.group_count(), 0, "the failed group is dropped");
    assert_eq!(table.session_count(), 1, "r2's session is still indexed");

    tokio::time::advance(TTL).await;
    table.expire_sessions(Instant::now());
    assert_eq!(table.session_count(), 0, "and expires like any other");
    cancel.cancel();
}

/// A poll answers at once when the dispatchers named dead changed since its session's last
/// answer, even when the change came before the poll began to watch for one (between two
/// polls): the replica must hear of it to report its sessions there. Told once, the next poll
/// waits as usual.
#[tokio::test(start_paused = true)]
async fn a_poll_answers_at_once_when_the_dead_changed_since_its_sessions_last_answer() {
    let cancel = CancellationToken::new();
    let (table, mut api) = table(&cancel);
    let opening = open(&table, "r1");
    api.next().await.list(10, &[]);
    let _stream = api.next().await.open();
    let opened = within("the session opened", opening)
        .await
        .expect("joined")
        .expect("opened");
    let session = opened.session_id.as_str();
    let wait = Duration::from_secs(1);
    let timed_poll = || async {
        let began = Instant::now();
        let polled = within(
            "a poll ended",
            table.poll(session, &Caller::Anonymous, vec![], wait, 100, usize::MAX),
        )
        .await
        .expect("polled");
        (began.elapsed(), polled.named.for_replicas("d0"))
    };
    let (took, named) = timed_poll().await;
    assert_eq!((took, named), (wait, (vec![], false)), "nothing to tell");

    // Named between two polls: the next answers at once.
    table
        .lease_sessions()
        .set_dead([("d9".to_owned(), [7].into()), ("d0".to_owned(), [8].into())].into());
    let (took, named) = timed_poll().await;
    assert_eq!(took, Duration::ZERO, "answered at once");
    assert_eq!(named, (vec!["d9".to_owned()], true));
    let (took, named) = timed_poll().await;
    assert_eq!(took, wait, "told already: the poll waits");
    assert_eq!(named, (vec!["d9".to_owned()], true));
    cancel.cancel();
}
