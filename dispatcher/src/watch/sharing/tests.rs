use std::sync::{Arc, atomic::AtomicU64};

use futures::AsyncReadExt;
use kube::api::ListParams;
use kube_dispatch_core::handover::Slice;
use kube_dispatch_proto::{Ring, RingKey, credentials::Credentials};
use tokio::sync::watch;

use super::*;
use crate::watch::{
    scripted_api::{ApiServer, object},
    side_list::SideList,
};

/// Sharing for `d0`, the only member of a ring keyed by name: it lists everything itself.
fn alone_on_the_ring() -> (Arc<ListSharing>, ApiServer) {
    let (client, api) = ApiServer::start();
    (sharing_through(client), api)
}

fn sharing_through(client: kube::Client) -> Arc<ListSharing> {
    let ring = Ring::with_key(["d0"], RingKey::Name);
    let (_, slice) = watch::channel(Arc::new(Slice::fixed("d0", ring)));
    ListSharing::new(client, "d0", Credentials::plaintext(), slice)
}

/// The first page of a whole list of every ConfigMap.
fn first_page() -> http::Request<Vec<u8>> {
    kube::core::Request::new("/api/v1/configmaps")
        .list(&ListParams::default().limit(500))
        .expect("a list request")
}

/// A reader of the first page through `sharing`, started now: its whole body, or its error.
fn reader(sharing: &Arc<ListSharing>) -> tokio::task::JoinHandle<kube::Result<String>> {
    let sharing = sharing.clone();
    tokio::spawn(async move {
        let mut body = sharing.respond(first_page(), 0).await?;
        let mut text = String::new();
        body.read_to_string(&mut text)
            .await
            .map_err(kube::Error::ReadEvents)?;
        Ok(text)
    })
}

async fn body_of(reader: tokio::task::JoinHandle<kube::Result<String>>) -> String {
    reader
        .await
        .expect("the reader ran")
        .expect("the list was read")
}

/// Three watches that list the same while it is being made read one response: the API server
/// is asked once, and each reads every object.
#[tokio::test(start_paused = true)]
async fn lists_asked_while_one_is_made_share_it() {
    let (sharing, mut api) = alone_on_the_ring();
    let readers: Vec<_> = (0..3).map(|_| reader(&sharing)).collect();
    let asked = api.next().await;
    assert!(asked.is_whole_list(), "the first page was asked for");
    asked.list(7, &[("a", 5), ("b", 6)]);
    let mut bodies = Vec::new();
    for r in readers {
        bodies.push(body_of(r).await);
    }
    assert!(
        bodies[0].contains(&object("a", 5)) && bodies[0].contains(&object("b", 6)),
        "the response holds both objects: {}",
        bodies[0]
    );
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "one response for all"
    );
    assert!(api.asks_nothing_more().await, "one LIST for three watches");
    assert_eq!(sharing.counts.made.load(Ordering::Relaxed), 1);
    assert_eq!(sharing.counts.joined.load(Ordering::Relaxed), 2);
}

/// A response kept whole is joined for a second after its end, then made again.
#[tokio::test(start_paused = true)]
async fn a_small_response_is_joined_for_a_second_after_it_ended() {
    let (sharing, mut api) = alone_on_the_ring();
    let first = reader(&sharing);
    api.next().await.list(7, &[("a", 5)]);
    let made = body_of(first).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        body_of(reader(&sharing)).await,
        made,
        "0.9 s after its end, the list is still joined"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = reader(&sharing);
    api.next().await.list(8, &[("a", 5), ("c", 8)]);
    assert!(
        body_of(late).await.contains(&object("c", 8)),
        "1.1 s after, a new list is made"
    );
    assert_eq!(sharing.counts.made.load(Ordering::Relaxed), 2);
}

/// The API server's refusal is the error of every reader that joined, with its code, and of
/// them only.
#[tokio::test(start_paused = true)]
async fn a_refusal_is_each_readers_error() {
    let (sharing, mut api) = alone_on_the_ring();
    let readers: Vec<_> = (0..2).map(|_| reader(&sharing)).collect();
    api.next()
        .await
        .refuse(429, "TooManyRequests", "too many requests");
    for r in readers {
        match r.await.expect("the reader ran") {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 429),
            other => panic!("expected the API server's refusal, got {other:?}"),
        }
    }
    // Not kept: the next reader asks the API server again.
    let next = reader(&sharing);
    api.next().await.list(7, &[("a", 5)]);
    assert!(body_of(next).await.contains(&object("a", 5)));
}

/// A response of many parts, for `api`'s next request, with the name of its last object.
fn many_parts(asked: crate::watch::scripted_api::Asked) -> String {
    // More parts than a reader may have waiting.
    let objects: Vec<String> = (0..READER_PARTS * 8)
        .map(|i| format!("{}{}", "x".repeat(CHUNK_BYTES), i))
        .collect();
    let named: Vec<(&str, u64)> = objects.iter().map(|n| (n.as_str(), 1)).collect();
    asked.list(7, &named);
    object(&objects[objects.len() - 1], 1)
}

/// A second reader of the first page through `sharing`, whose body `read` reads as it will;
/// returned once it has joined the LIST the first reader made.
async fn joined<T, F>(
    sharing: &Arc<ListSharing>,
    read: impl FnOnce(Body) -> F + Send + 'static,
) -> tokio::task::JoinHandle<kube::Result<T>>
where
    T: Send + 'static,
    F: std::future::Future<Output = kube::Result<T>> + Send,
{
    let task = {
        let sharing = sharing.clone();
        tokio::spawn(async move { read(sharing.respond(first_page(), 0).await?).await })
    };
    let joins = || sharing.counts.joined.load(Ordering::Relaxed);
    crate::watch::scripted_api::until("the second reader joined", || joins() == 1).await;
    task
}

/// A reader that takes nothing holds the others back for its allowance only; it is then left
/// behind, and its list fails as a broken relay (made again alone), not as a list cut short.
#[tokio::test(start_paused = true)]
async fn a_reader_that_takes_nothing_is_left_behind() {
    let (sharing, mut api) = alone_on_the_ring();
    let reading = reader(&sharing);
    let asked = api.next().await;
    // Takes the first part, then reads nothing.
    let stalled = joined(&sharing, |body| async { Ok(body) }).await;
    let started = Instant::now();
    let last = many_parts(asked);
    let mut stalled = stalled.await.expect("joined").expect("a response");
    assert!(body_of(reading).await.contains(&last));
    let held = started.elapsed();
    assert!(
        (READER_ALLOWANCE..READER_ALLOWANCE + Duration::from_secs(1)).contains(&held),
        "the reader was held {held:?}, until the stalled one was left behind"
    );
    let mut rest = Vec::new();
    let error = stalled
        .read_to_end(&mut rest)
        .await
        .expect_err("the stalled reader's list fails");
    assert!(relay_broke(&error), "a broken relay: {error}");
}

/// A reader that takes a part now and then, just often enough never to stall for long at once,
/// still uses its allowance up: the others are held back about that long in all, not for every
/// part it was slow to take.
#[tokio::test(start_paused = true)]
async fn a_slow_reader_uses_its_allowance_up() {
    let (sharing, mut api) = alone_on_the_ring();
    let reading = reader(&sharing);
    let asked = api.next().await;
    let slow = joined(&sharing, |mut body| async move {
        let mut part = vec![0; CHUNK_BYTES];
        loop {
            tokio::time::sleep(Duration::from_secs(3)).await;
            if body
                .read(&mut part)
                .await
                .map_err(kube::Error::ReadEvents)?
                == 0
            {
                return Ok(());
            }
        }
    })
    .await;
    let started = Instant::now();
    let last = many_parts(asked);
    assert!(body_of(reading).await.contains(&last));
    let held = started.elapsed();
    assert!(
        held <= READER_ALLOWANCE + Duration::from_secs(3),
        "the reader was held {held:?}, for each part the slow one took late"
    );
    match slow.await.expect("the slow reader ran") {
        Err(kube::Error::ReadEvents(e)) => assert!(relay_broke(&e), "{e}"),
        other => panic!("the slow reader was to be left behind: {other:?}"),
    }
}

/// A shared list the API server cut short at the lister reads as cut short, as the reader's own
/// would have (the watch lists another way at once, not three times more in whole); one whose
/// relay broke (the lister gone, the reader left behind) reads as a broken relay, listed again
/// alone.
#[tokio::test]
async fn a_list_cut_short_and_a_broken_relay_differ() {
    let read = |parts: Vec<Part>| async move {
        let mut body = response(futures::stream::iter(parts).boxed())
            .await
            .expect("a response");
        let mut rest = Vec::new();
        body.read_to_end(&mut rest).await.map(|_| rest)
    };
    let data = || Part::Data(Bytes::from_static(b"{\"items\":["));
    let broke = read(vec![data(), Part::Broke("reset".into())]).await;
    assert!(broke.is_err_and(|e| !relay_broke(&e)));
    let left = read(vec![data()]).await;
    assert!(left.is_err_and(|e| relay_broke(&e)));
    let whole = read(vec![
        data(),
        Part::Data(Bytes::from_static(b"]}")),
        Part::End,
    ])
    .await;
    assert_eq!(whole.ok().as_deref(), Some(&b"{\"items\":[]}"[..]));
}

/// What `Peer.List` sends reads back as the parts it was made of.
#[tokio::test]
async fn the_relay_carries_each_kind_of_part() {
    let refused = Status::failure("no", "Forbidden").with_code(403);
    let parts = vec![
        Part::Data(Bytes::from_static(b"abc")),
        Part::Refused(Arc::new(refused)),
    ];
    let back: Vec<Part> = relayed(futures::stream::iter(parts).boxed())
        .map(part_of)
        .collect()
        .await;
    assert!(matches!(&back[0], Part::Data(d) if &d[..] == b"abc"));
    assert!(matches!(&back[1], Part::Refused(s) if s.code == 403 && s.reason == "Forbidden"));
    let broke: Vec<Part> = relayed(futures::stream::iter([Part::Broke("reset".into())]).boxed())
        .map(part_of)
        .collect()
        .await;
    assert!(matches!(&broke[..], [Part::Broke(m)] if &**m == "reset"));
    let left: Vec<Part> = relayed(futures::stream::iter([Part::Data(Bytes::new())]).boxed())
        .map(part_of)
        .collect()
        .await;
    assert!(
        matches!(&left[..], [Part::Data(_), Part::Failed(_)]),
        "a relay that ends without its end says so"
    );
}

#[test]
fn peers_may_ask_for_lists_of_collections_only() {
    for good in [
        "/api/v1/configmaps?limit=500",
        "/api/v1/namespaces/team-a/configmaps?labelSelector=app%3Dweb",
        "/apis/apps/v1/deployments",
        "/apis/example.com/v1/namespaces/x/widgets?continue=abc",
        "/api/v1/namespaces",
    ] {
        assert!(list_path(good).is_ok(), "{good}");
    }
    for bad in [
        "/api/v1/namespaces/team-a",
        "/api/v1/namespaces/team-a/pods/p/log",
        "/api/v1/configmaps?watch=true",
        "/api/v1/namespaces/a/pods/p/log?follow=true",
        "/apis/apps/v1/namespaces/x/deployments/d/scale",
        "/api/v1/../secrets",
        "/api//v1/configmaps",
        "/healthz",
        "/metrics",
        "/api/v1/namespaces/x/pods%2Fp%2Flog",
        "/api",
        "/apis/apps",
    ] {
        assert!(list_path(bad).is_err(), "{bad}");
    }
    let long = format!(
        "/api/v1/configmaps?labelSelector={}",
        "a".repeat(MAX_PATH_BYTES)
    );
    assert!(list_path(&long).is_err());
}

/// The whole-list watch of every ConfigMap through `client`, its lists shared through
/// `sharing`, polled (errors included) until the returned task is aborted.
fn watching(client: kube::Client, sharing: &Arc<ListSharing>) -> tokio::task::JoinHandle<()> {
    let mut events = crate::watch::whole_list::watcher(
        config_maps_api(client),
        ListParams::default(),
        Some(sharing.clone()),
        (false, Arc::new(config_map_types())),
        Arc::default(),
    )
    .boxed();
    tokio::spawn(async move { while events.next().await.is_some() {} })
}

/// A watch's first list is shared; its re-list after a 410 Gone is a LIST of its own, although
/// the first list's response could still be joined: it may be older than what the stream showed.
#[tokio::test(start_paused = true)]
async fn only_a_watchs_first_list_is_shared() {
    let (client, mut api) = ApiServer::start();
    let sharing = sharing_through(client.clone());
    let polled = watching(client, &sharing);
    api.next().await.list(7, &[("a", 5)]);
    let watch = api.next().await;
    assert!(watch.watch, "the watch follows its list");
    let stream = watch.open();
    stream.send("ADDED", object("b", 8));
    stream.gone();
    let relist = api.next().await;
    assert!(
        relist.is_whole_list(),
        "the re-list is asked of the API server, not joined"
    );
    assert_eq!(sharing.counts.made.load(Ordering::Relaxed), 1);
    assert_eq!(sharing.counts.joined.load(Ordering::Relaxed), 0);
    polled.abort();
}

/// A first list the API server refused is shared when asked again: the watch has shown
/// nothing yet, and its peers, refused too, ask at the same time.
#[tokio::test(start_paused = true)]
async fn a_refused_first_list_is_shared_when_asked_again() {
    let (client, mut api) = ApiServer::start();
    let sharing = sharing_through(client.clone());
    let polled = watching(client, &sharing);
    api.next()
        .await
        .refuse(429, "TooManyRequests", "too many requests");
    api.next().await.list(7, &[("a", 5)]);
    assert!(api.next().await.watch, "listed, the watch follows");
    assert_eq!(
        sharing.counts.made.load(Ordering::Relaxed),
        2,
        "both shared"
    );
    polled.abort();
}

/// The type of a ConfigMap.
fn config_map_types() -> kube::api::TypeMeta {
    kube::api::TypeMeta {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
    }
}

/// Every ConfigMap, as the watches of these tests read them.
fn config_maps_api(client: kube::Client) -> kube::Api<crate::watch::object::WatchedObject> {
    let resource = kube::api::ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
    };
    kube::Api::all_with(client, &resource)
}

/// A whole-list watch's position follows what it shows: a list's resourceVersion from its
/// first object, each event's, and a bookmark's, from which the watch resumes.
#[tokio::test(start_paused = true)]
async fn a_whole_list_watch_knows_how_far_it_has_shown() {
    use kube::runtime::watcher::Event;
    let (client, mut api) = ApiServer::start();
    let position = Arc::new(crate::watch::whole_list::Position::default());
    let mut events = crate::watch::whole_list::watcher(
        config_maps_api(client),
        ListParams::default(),
        None,
        (false, Arc::new(config_map_types())),
        position.clone(),
    )
    .boxed();
    let (shown, mut read) = tokio::sync::mpsc::unbounded_channel();
    let polled = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            let event = event.expect("no error");
            if shown.send(event).is_err() {
                return;
            }
        }
    });
    assert_eq!(position.get(), 0, "nothing shown yet");
    api.next().await.list(7, &[("a", 5)]);
    assert!(matches!(read.recv().await, Some(Event::Init)));
    assert!(matches!(read.recv().await, Some(Event::InitApply(_))));
    assert_eq!(position.get(), 7, "the list's, from its first object");
    assert!(matches!(read.recv().await, Some(Event::InitDone)));
    let stream = api.next().await.open();
    stream.send("ADDED", object("b", 9));
    assert!(matches!(read.recv().await, Some(Event::Apply(_))));
    assert_eq!(position.get(), 9, "the event's");
    stream.send(
        "BOOKMARK",
        r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"12"}}"#.into(),
    );
    drop(stream);
    let watch = api.next().await;
    assert_eq!(
        watch.param("resourceVersion"),
        Some("12"),
        "resumed from the bookmark"
    );
    assert_eq!(position.get(), 12, "the bookmark's");
    let stream = watch.open();
    stream.send("DELETED", object("a", 13));
    assert!(matches!(read.recv().await, Some(Event::Delete(_))));
    assert_eq!(position.get(), 13);
    polled.abort();
}

/// The names a list beside the stream shows, to its end.
async fn listed_beside(mut side: Option<SideList>) -> Vec<String> {
    let mut names = Vec::new();
    while let Some(page) = crate::watch::side_list::next_page(&mut side).await {
        names.extend(page.iter().map(kube::ResourceExt::name_any));
    }
    names
}

/// A list beside the stream through `sharing`, its stream at `since`.
fn side_list(client: &kube::Client, sharing: &Arc<ListSharing>, since: u64) -> SideList {
    use crate::watch::side_list::{Beside, Reach};
    SideList::start(
        config_maps_api(client.clone()),
        ListParams::default(),
        Reach::All,
        true,
        (false, Arc::new(config_map_types())),
        Some(Beside {
            sharing: sharing.clone(),
            since,
        }),
    )
}

/// A list beside the stream reads a LIST the tier shares only if it is at least as new as
/// what the stream had shown when the list was asked for: the lister, which reads each LIST's
/// resourceVersion from the start of its response, makes another for it when the one it kept
/// is older; a LIST joined before its resourceVersion was known, and found older, is left for
/// another.
#[tokio::test(start_paused = true)]
async fn a_list_beside_the_stream_is_shared_only_if_new_enough() {
    let (client, mut api) = ApiServer::start();
    let sharing = sharing_through(client.clone());
    let count = |counter: fn(&SharingCounts) -> &AtomicU64| {
        counter(&sharing.counts).load(Ordering::Relaxed)
    };

    // A LIST at 7 (a peer's, say), whose small response is kept for a second.
    let early = reader(&sharing);
    api.next().await.list(7, &[("a", 5), ("b", 6)]);
    body_of(early).await;

    // The stream had shown 7: the list at 7 is taken, and the API server is asked nothing.
    let listing = tokio::spawn(listed_beside(Some(side_list(&client, &sharing, 7))));
    assert_eq!(listing.await.expect("listed"), ["a", "b"]);
    assert_eq!((count(|c| &c.made), count(|c| &c.joined)), (1, 1));

    // The stream had shown 9: the lister knows the list it kept is at 7, and makes another.
    let listing = tokio::spawn(listed_beside(Some(side_list(&client, &sharing, 9))));
    let another = api.next().await;
    assert!(another.is_whole_list(), "another LIST");
    another.list(10, &[("a", 5), ("c", 10)]);
    assert_eq!(
        listing.await.expect("listed"),
        ["a", "c"],
        "the new list's objects"
    );
    assert_eq!((count(|c| &c.made), count(|c| &c.joined)), (2, 1));
    assert_eq!(count(|c| &c.too_old), 0);

    // A LIST under way whose response has not begun is joined; at 11, older than the stream's
    // 12, it is left, and the lister, knowing it now, makes another.
    tokio::time::advance(REUSE * 2).await;
    let early = reader(&sharing);
    let in_flight = api.next().await;
    let listing = tokio::spawn(listed_beside(Some(side_list(&client, &sharing, 12))));
    // Answered once the list beside the stream has joined it.
    while count(|c| &c.joined) < 2 {
        tokio::task::yield_now().await;
    }
    in_flight.list(11, &[("a", 5), ("b", 11)]);
    body_of(early).await;
    let another = api.next().await;
    assert!(another.is_whole_list(), "another LIST");
    another.list(13, &[("a", 5), ("d", 13)]);
    assert_eq!(listing.await.expect("listed"), ["a", "d"]);
    assert_eq!(count(|c| &c.too_old), 1, "one shared list found too old");
    assert!(api.asks_nothing_more().await);
}

/// A list whose resourceVersion comes after its objects (a custom resource's JSON list) is
/// shared beside the stream all the same: its objects are held until the end of its first
/// response tells its resourceVersion, then taken if new enough, else dropped for another
/// LIST, which the lister makes knowing the first one's by then.
#[tokio::test(start_paused = true)]
async fn a_list_that_tells_its_resource_version_last_is_held_until_then() {
    let (client, mut api) = ApiServer::start();
    let sharing = sharing_through(client.clone());
    let count = |counter: fn(&SharingCounts) -> &AtomicU64| {
        counter(&sharing.counts).load(Ordering::Relaxed)
    };

    let listing = tokio::spawn(listed_beside(Some(side_list(&client, &sharing, 9))));
    api.next()
        .await
        .list_metadata_last(10, &[("a", 5), ("b", 6)]);
    assert_eq!(
        listing.await.expect("listed"),
        ["a", "b"],
        "new enough: taken"
    );
    assert_eq!(count(|c| &c.too_old), 0);

    tokio::time::advance(REUSE * 2).await;
    let listing = tokio::spawn(listed_beside(Some(side_list(&client, &sharing, 12))));
    api.next()
        .await
        .list_metadata_last(11, &[("a", 5), ("b", 6)]);
    let another = api.next().await;
    assert!(
        another.is_whole_list(),
        "another LIST, the first found too old"
    );
    another.list_metadata_last(13, &[("a", 5), ("c", 13)]);
    assert_eq!(
        listing.await.expect("listed"),
        ["a", "c"],
        "only the new list's objects"
    );
    assert_eq!(count(|c| &c.too_old), 1);
    assert_eq!(count(|c| &c.made), 3);
    assert!(api.asks_nothing_more().await);
}

/// The parts a lister relays: what the response brings within 2 ms of a part's first bytes, at
/// most [`CHUNK_BYTES`], the rest of a longer chunk beginning the next; bytes read before the
/// response broke off go out before the error, and the end after the last bytes.
#[tokio::test(start_paused = true)]
async fn a_relayed_part_gathers_what_comes_within_2_ms_up_to_its_size() {
    use futures::TryStreamExt;

    use shared::{Then, gather};

    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(16);
    let body = tokio_stream::wrappers::ReceiverStream::new(rx).into_async_read();
    let mut body = std::pin::pin!(body);
    let mut data = Vec::new();
    for piece in ["aa", "bb", "cc"] {
        tx.send(Ok(piece.into())).await.expect("read");
    }
    let later = tx.clone();
    let pieces = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        later.send(Ok("dd".into())).await.expect("read");
        tokio::time::sleep(Duration::from_millis(5)).await;
        later.send(Ok("ee".into())).await.expect("read");
    });
    let (part, then) = gather(body.as_mut(), &mut data).await;
    assert_eq!(&part[..], b"aabbccdd", "what came within 2 ms, in one part");
    assert!(matches!(then, Then::More), "{then:?}");
    let (part, then) = gather(body.as_mut(), &mut data).await;
    assert_eq!(
        &part[..],
        b"ee",
        "what came after the window begins the next part"
    );
    assert!(matches!(then, Then::More), "{then:?}");
    pieces.await.expect("sent");

    tx.send(Ok(vec![7; CHUNK_BYTES + 10])).await.expect("read");
    let (part, then) = gather(body.as_mut(), &mut data).await;
    assert_eq!(part.len(), CHUNK_BYTES, "a part holds at most CHUNK_BYTES");
    assert!(matches!(then, Then::More), "{then:?}");
    tx.send(Err(std::io::Error::other("cut off")))
        .await
        .expect("read");
    let (part, then) = gather(body.as_mut(), &mut data).await;
    assert_eq!(part.len(), 10, "the rest of the long chunk");
    assert!(matches!(then, Then::Broke(_)), "{then:?}");

    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(16);
    let body = tokio_stream::wrappers::ReceiverStream::new(rx).into_async_read();
    let mut body = std::pin::pin!(body);
    tx.send(Ok("last".into())).await.expect("read");
    drop(tx);
    let (part, then) = gather(body.as_mut(), &mut data).await;
    assert_eq!(&part[..], b"last");
    assert!(matches!(then, Then::End), "{then:?}");
}
