//! A scripted API server for the watches' unit tests: `tower_test`'s mock service behind a
//! real `kube::Client`. A test answers the requests of the code under test one by one (a list,
//! an error, a watch stream it writes events to) and checks what it asks next, and when, on a
//! paused clock.

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use kube::client::Body;
use kube_dispatch_core::{
    handover::Slice,
    queue::{Delivery, Outcome, QueueConfig, SessionId, pool::Pools},
    recent_deletions::RecentDeletionsConfig,
    subscription::{GroupSpec, ResourceId, WatchKey},
};
use kube_dispatch_proto::Ring;
use kube_dispatch_server::auth::GroupId;
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tower_test::mock;

use crate::{
    group::{Group, SessionSlot},
    watch::whole_list::FIRST_PAGE,
};

type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// Longest a test waits (in the paused clock) for the next request.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// A request, as the API server reads it.
#[derive(Debug)]
pub(crate) struct Asked {
    /// Whether it is a watch (else a list).
    pub watch: bool,
    /// Its query parameters.
    pub query: Vec<(String, String)>,
    /// Its Accept header.
    pub accept: String,
    respond: mock::SendResponse<Response<ResponseBody>>,
    /// When it arrived.
    pub at: Instant,
}

impl Asked {
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn is_paged_list(&self) -> bool {
        !self.watch && self.param("limit").is_some()
    }

    /// The first request of a whole list ([`crate::watch::whole_list`]): a first page of
    /// [`FIRST_PAGE`] objects (as a paged list's first page looks too).
    pub(crate) fn is_whole_list(&self) -> bool {
        !self.watch
            && self.param("continue").is_none()
            && self.param("limit") == Some(FIRST_PAGE.to_string().as_str())
    }

    /// The rest of a whole list: from where its first page ended, without a limit.
    pub(crate) fn is_rest_of_whole_list(&self) -> bool {
        !self.watch && self.param("continue").is_some() && self.param("limit").is_none()
    }

    pub(crate) fn streams_list(&self) -> bool {
        self.watch && self.param("sendInitialEvents") == Some("true")
    }

    /// Answers a list of `objects` at `resource_version`.
    pub(crate) fn list(self, resource_version: u64, objects: &[(&str, u64)]) {
        let items: Vec<String> = objects.iter().map(|(n, rv)| object(n, *rv)).collect();
        self.list_raw(resource_version, &items);
    }

    /// Answers a list of `objects` (JSON, as [`owned_object`] makes them) at
    /// `resource_version`.
    pub(crate) fn list_raw(self, resource_version: u64, objects: &[String]) {
        let body = list_json(resource_version, objects);
        self.respond.send_response(answer(StatusCode::OK, body));
    }

    /// Answers a list in protobuf: `body`, an envelope.
    pub(crate) fn list_protobuf(self, body: Vec<u8>) {
        let response = Response::builder()
            .status(StatusCode::OK)
            .header("content-type", crate::watch::protobuf::MEDIA_TYPE)
            .body(
                http_body_util::Full::new(Bytes::from(body))
                    .map_err(|e| match e {})
                    .boxed_unsync(),
            )
            .expect("a response");
        self.respond.send_response(response);
    }

    /// Answers a list of `objects` at `resource_version` as a custom resource's is written,
    /// its keys sorted: its metadata after its items.
    pub(crate) fn list_metadata_last(self, resource_version: u64, objects: &[(&str, u64)]) {
        let items: Vec<String> = objects.iter().map(|(n, rv)| object(n, *rv)).collect();
        let body = format!(
            r#"{{"apiVersion":"v1","items":[{}],"kind":"ConfigMapList","metadata":{{"resourceVersion":"{resource_version}"}}}}"#,
            items.join(",")
        );
        self.respond.send_response(answer(StatusCode::OK, body));
    }

    /// Answers a page of a list: `objects` at `resource_version`, the list going on from
    /// `continue_token`.
    pub(crate) fn list_page(
        self,
        resource_version: u64,
        objects: &[(&str, u64)],
        continue_token: &str,
    ) {
        let items: Vec<String> = objects.iter().map(|(n, rv)| object(n, *rv)).collect();
        let body = list_json(resource_version, &items).replacen(
            r#""metadata":{"#,
            &format!(r#""metadata":{{"continue":"{continue_token}","#),
            1,
        );
        self.respond.send_response(answer(StatusCode::OK, body));
    }

    /// Answers with an error status.
    pub(crate) fn refuse(self, code: u16, reason: &str, message: &str) {
        let status = StatusCode::from_u16(code).expect("a status code");
        self.respond
            .send_response(answer(status, status_json(code, reason, message)));
    }

    /// Answers with a body that ends before its JSON does.
    pub(crate) fn cut_short(self, objects: &[(&str, u64)]) {
        let items: Vec<String> = objects.iter().map(|(n, rv)| object(n, *rv)).collect();
        // The list as it would have been, cut after its items' separator: more was to come.
        let mut body = list_json(9, &items);
        body.truncate(body.len() - "]}".len());
        body.push(',');
        self.respond.send_response(answer(StatusCode::OK, body));
    }

    /// Opens a watch stream; its events are sent through the returned sender, and dropping the
    /// sender ends it.
    pub(crate) fn open(self) -> Stream {
        let (tx, rx) = mpsc::unbounded_channel::<Result<Frame<Bytes>, Infallible>>();
        let frames = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|frame| (frame, rx))
        });
        let body = StreamBody::new(frames).boxed_unsync();
        self.respond.send_response(
            Response::builder()
                .status(StatusCode::OK)
                .body(body)
                .expect("a response"),
        );
        Stream(tx)
    }
}

/// An open watch stream.
pub(crate) struct Stream(mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>);

impl Stream {
    pub(crate) fn send(&self, kind: &str, object: String) {
        let line = format!(r#"{{"type":"{kind}","object":{object}}}"#) + "\n";
        self.0
            .send(Ok(Frame::data(Bytes::from(line))))
            .expect("the watch is still read");
    }

    /// Ends a streaming list's initial events: the bookmark that says every object that
    /// exists at `resource_version` was sent.
    pub(crate) fn initial_events_end(&self, resource_version: u64) {
        self.send(
            "BOOKMARK",
            format!(
                r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"resourceVersion":"{resource_version}","annotations":{{"k8s.io/initial-events-end":"true"}}}}}}"#
            ),
        );
    }

    /// Whether the client still reads the stream.
    pub(crate) fn is_open(&self) -> bool {
        !self.0.is_closed()
    }

    /// Waits until the client stops reading the stream.
    pub(crate) async fn closed(&self) {
        tokio::time::timeout(PATIENCE, self.0.closed())
            .await
            .expect("the watch was dropped within a minute");
    }

    pub(crate) fn gone(&self) {
        self.send(
            "ERROR",
            status_json(410, "Expired", "too old resource version"),
        );
    }
}

fn answer(status: StatusCode, body: String) -> Response<ResponseBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            http_body_util::Full::new(Bytes::from(body))
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
        .expect("a response")
}

/// A ConfigMap `name` of namespace `ns` at `resource_version` that the Deployment `owner`
/// controls, as the API server sends it.
pub(crate) fn owned_object(name: &str, resource_version: u64, owner: &str) -> String {
    config_map(
        name,
        resource_version,
        &format!(
            r#","ownerReferences":[{{"apiVersion":"apps/v1","kind":"Deployment","name":"{owner}","uid":"uid-{owner}","controller":true}}]"#
        ),
    )
}

/// A ConfigMap `name` of namespace `ns` at `resource_version`, as the API server sends it.
pub(crate) fn object(name: &str, resource_version: u64) -> String {
    config_map(name, resource_version, "")
}

/// A ConfigMap `name` of namespace `ns`, whose metadata ends with `more` (JSON members, each
/// after a comma).
fn config_map(name: &str, resource_version: u64, more: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"ns","uid":"uid-{name}","resourceVersion":"{resource_version}"{more}}},"data":{{"k":"v"}}}}"#
    )
}

/// A ConfigMap list of `items` (JSON) at `resource_version`.
fn list_json(resource_version: u64, items: &[String]) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMapList","metadata":{{"resourceVersion":"{resource_version}"}},"items":[{}]}}"#,
        items.join(",")
    )
}

fn status_json(code: u16, reason: &str, message: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Status","metadata":{{}},"status":"Failure","message":"{message}","reason":"{reason}","code":{code}}}"#
    )
}

/// The scripted API server: the requests of the client [`ApiServer::start`] gives.
pub(crate) struct ApiServer(mock::Handle<Request<Body>, Response<ResponseBody>>);

impl ApiServer {
    /// A client whose requests this server answers.
    pub(crate) fn start() -> (kube::Client, Self) {
        let (service, handle) = mock::pair::<Request<Body>, Response<ResponseBody>>();
        (kube::Client::new(service, "default"), Self(handle))
    }

    /// The next request; fails the test if none comes within [`PATIENCE`].
    pub(crate) async fn next(&mut self) -> Asked {
        let (request, respond) = tokio::time::timeout(PATIENCE, self.0.next_request())
            .await
            .expect("the API server was asked something within a minute")
            .expect("the client is alive");
        assert_eq!(
            request.uri().path(),
            "/api/v1/configmaps",
            "the watch asks for its resource"
        );
        let query = request
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect::<Vec<_>>();
        let accept = request.headers().get(http::header::ACCEPT);
        let accept = accept.and_then(|a| a.to_str().ok()).unwrap_or_default();
        Asked {
            watch: query.iter().any(|(k, v)| k == "watch" && v == "true"),
            accept: accept.to_owned(),
            query,
            respond,
            at: Instant::now(),
        }
    }

    /// Whether nothing more is asked within [`PATIENCE`] (the client may be gone).
    pub(crate) async fn asks_nothing_more(&mut self) -> bool {
        tokio::time::timeout(PATIENCE, self.0.next_request())
            .await
            .map_or(true, |r| r.is_none())
    }
}

/// The watch of ConfigMaps in every namespace.
pub(crate) fn config_maps() -> WatchKey {
    WatchKey {
        resource: ResourceId {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        },
        namespace: String::new(),
        label_selector: String::new(),
        field_selector: String::new(),
    }
}

/// The slice of the only dispatcher of a ring: every key is served here.
pub(crate) fn alone() -> watch::Receiver<Arc<Slice>> {
    watch::channel(Arc::new(Slice::fixed("d0", Ring::new(["d0"])))).1
}

/// The session of the groups [`Member::join`] makes.
pub(crate) const SESSION: SessionId = 1;

/// A group with one session ([`SESSION`]), as a replica sees it.
pub(crate) struct Member {
    /// The group.
    pub group: Arc<Group>,
    slot: Arc<SessionSlot>,
}

impl Member {
    /// A group `name` on `slice`, with one session.
    pub(crate) fn join(
        name: &str,
        slice: watch::Receiver<Arc<Slice>>,
        cancel: &CancellationToken,
    ) -> Self {
        let group = Group::spawn(
            GroupId::shared(name),
            GroupSpec::new(Vec::new()),
            QueueConfig::default(),
            Pools::unbounded(),
            RecentDeletionsConfig::NONE,
            slice,
            cancel.clone(),
        );
        let (slot, _) = group
            .add_session(SESSION, "s1".into(), "r1", Duration::from_secs(3600), None)
            .expect("a session");
        Self { group, slot }
    }

    /// Waits until the session is woken: keys became ready for it.
    pub(crate) async fn woken(&self) {
        tokio::time::timeout(PATIENCE, self.slot.notify.notified())
            .await
            .expect("keys became ready within a minute");
    }

    /// Everything ready for the session, each acknowledged: `(name, deleted)` in key order.
    pub(crate) fn delivered(&self) -> Vec<(String, bool)> {
        let taken: Vec<Delivery> = self.group.take(SESSION, 1000, usize::MAX);
        let acks = taken
            .iter()
            .map(|d| (d.id, Outcome::Success).into())
            .collect();
        self.group.ack(SESSION, acks);
        let mut out: Vec<(String, bool)> = taken
            .into_iter()
            .map(|d| {
                let name = d.key.rsplit('/').next().unwrap_or_default().to_owned();
                (name, d.deleted)
            })
            .collect();
        out.sort();
        out
    }
}

/// `(name, deleted)` pairs, as [`Member::delivered`] gives them.
pub(crate) fn named(names: &[(&str, bool)]) -> Vec<(String, bool)> {
    names.iter().map(|(n, d)| ((*n).to_owned(), *d)).collect()
}

/// `future`'s output, failing the test with `what` if it takes longer than [`PATIENCE`] (on a
/// paused clock, a wait that nothing will end fails at once instead of hanging).
pub(crate) async fn within<F: std::future::Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} within a minute"))
}

/// Waits until `done` holds, failing the test with `what` after [`PATIENCE`]: for a change that
/// nothing announces but a counter (a watch's figures). Checked every millisecond of the paused
/// clock, which advances only while every task waits, so no check races the task it watches.
pub(crate) async fn until(what: &str, done: impl Fn() -> bool) {
    within(what, async {
        while !done() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
}
