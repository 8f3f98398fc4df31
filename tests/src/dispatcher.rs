//! In-process dispatchers for integration tests: served on `127.0.0.1:0` against the real API
//! server, stopped when dropped, and a small session client that speaks the wire API.

use std::{
    net::SocketAddr,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use kube_dispatch_dispatcher::{
    config::{LeaseConfig, Membership, SecurityConfig, ServeConfig},
    serve::{Handles, serve},
    watch::registry::WatchCounts,
};
use kube_dispatch_proto::{
    credentials::{AuthChannel, Credentials},
    v1::{
        AckItem, AckRequest, OpenSessionRequest, PollRequest, ReconcileRequest, ResourceRef,
        Subscription, ack_item, dispatcher_client::DispatcherClient,
    },
};
use kube_dispatch_server::{auth::AuthConfig, authz::AuthzConfig, tls::Transport};

use crate::{
    FixtureError,
    isolated::{ApiAccess, Isolated, bind, spawn_server},
};

/// Settings for test dispatchers: short ttl and waits so tests finish quickly, and a fast
/// backoff so retries are observable ([`kube_dispatch_testing::config`]), secured as deployed
/// ([`test_security`]).
pub fn test_config(identity: &str, members: &[&str]) -> ServeConfig {
    ServeConfig {
        security: test_security(),
        ..kube_dispatch_testing::config(identity, members)
    }
}

/// Security as deployed: TLS with the test certificate, callers authenticated by TokenReview and
/// authorized by SubjectAccessReview, and Peer open to the test identity (which the dispatchers
/// use to call each other).
pub fn test_security() -> SecurityConfig {
    SecurityConfig {
        transport: Transport::Tls(crate::serving_tls(false)),
        authentication: Some(AuthConfig::default()),
        authorization: AuthzConfig::default(),
        peer_credentials: crate::credentials(),
        peer_users: Some(vec![crate::TESTER.to_owned()]),
    }
}

/// A dispatcher running in this process, on a runtime of its own.
#[derive(Debug)]
pub struct TestDispatcher {
    /// Where it serves gRPC.
    pub addr: SocketAddr,
    /// Its core and slice.
    pub handles: Handles,
    runner: Isolated,
}

impl TestDispatcher {
    /// A counter of its watches, summed over them all: e.g. `|c| &c.side_lists`.
    pub fn watch_total(&self, counter: impl Fn(&WatchCounts) -> &AtomicU64) -> u64 {
        self.handles
            .groups
            .watch_figures()
            .iter()
            .map(|w| counter(&w.counts).load(Ordering::Relaxed))
            .sum()
    }

    /// Starts a dispatcher with `config` against the shared cluster, on a free loopback port.
    pub async fn start(config: ServeConfig) -> Result<Self, FixtureError> {
        Self::start_at(config, "127.0.0.1:0").await
    }

    /// Starts a dispatcher on `address` (for example the address of one that was stopped).
    pub async fn start_at(config: ServeConfig, address: &str) -> Result<Self, FixtureError> {
        Self::start_with(config, address, None, None).await
    }

    /// Starts a dispatcher on `address` that reaches the API server through `api` (a fault
    /// proxy) when given, and advertises `advertise` (e.g. a fault proxy in front of it) on its
    /// Lease instead of its own address.
    pub async fn start_with(
        config: ServeConfig,
        address: &str,
        api: Option<std::net::SocketAddr>,
        advertise: Option<String>,
    ) -> Result<Self, FixtureError> {
        Self::start_reaching(config, address, api.into(), advertise).await
    }

    /// Starts a dispatcher with `config` that reaches the API server as `token`'s identity.
    pub async fn start_as(config: ServeConfig, token: String) -> Result<Self, FixtureError> {
        Self::start_reaching(config, "127.0.0.1:0", ApiAccess::Token(token), None).await
    }

    /// Starts a dispatcher with `config` on `address`, reaching the API server by `api`, and
    /// advertising `advertise` (else where it serves) on its Lease.
    pub async fn start_reaching(
        config: ServeConfig,
        address: &str,
        api: ApiAccess,
        advertise: Option<String>,
    ) -> Result<Self, FixtureError> {
        let (listener, addr) = bind(address)?;
        let mut config = config;
        if let Membership::Leases(lease) = &mut config.membership {
            lease.address = advertise.unwrap_or_else(|| addr.to_string());
        }
        let name = config.settings.identity.clone();
        let (runner, handles) =
            spawn_server(&name, listener, api, |client, listener, shutdown, tx| {
                serve(config, client, listener, shutdown, Some(tx))
            })
            .await?;
        Ok(Self {
            addr,
            handles,
            runner,
        })
    }

    /// A gRPC client of this dispatcher, as the test identity.
    pub async fn client(&self) -> DispatcherClient<AuthChannel> {
        self.client_as(&crate::credentials()).await
    }

    /// A gRPC client of this dispatcher with `credentials`.
    pub async fn client_as(&self, credentials: &Credentials) -> DispatcherClient<AuthChannel> {
        let channel = credentials
            .endpoint(&self.addr.to_string())
            .expect("the test dispatcher's address")
            .connect()
            .await
            .expect("connect to the test dispatcher");
        DispatcherClient::with_interceptor(channel, credentials.bearer())
    }

    /// Drains and stops it, waiting until it has.
    pub async fn stop(self) {
        self.runner.stop().await;
    }

    /// Freezes it for `duration` as `SIGSTOP` would: connections stay open, nothing answers.
    pub fn freeze(&self, duration: Duration) {
        self.runner.freeze(duration);
    }

    /// Kills it as `kill -9` would: no drain, no Lease release.
    pub fn kill(self) {
        self.runner.kill();
    }
}

/// Lease membership for test dispatchers in `namespace`: short leases so membership changes
/// show within seconds, and a handover bound of `bound`.
pub fn lease_membership(namespace: &str, identity: &str, bound: Duration) -> Membership {
    Membership::Leases(LeaseConfig {
        namespace: namespace.to_owned(),
        identity: identity.to_owned(),
        // Filled in with the listener's address at start.
        address: String::new(),
        duration: Duration::from_secs(2),
        renew_period: Duration::from_millis(400),
        grace: Duration::from_millis(500),
        handover_bound: bound,
        // Tests that join under load turn it on; the others open sessions by hand, not on
        // every dispatcher, and would wait the warm-up out.
        warm_up: Duration::ZERO,
    })
}

/// A test dispatcher `identity` with Lease membership in `namespace` ([`lease_membership`]) and
/// handover bound `bound`: its longest session ttl and reconcile time.
pub fn lease_config(namespace: &str, identity: &str, bound: Duration) -> ServeConfig {
    let mut config = test_config(identity, &[]);
    config.membership = lease_membership(namespace, identity, bound);
    config.settings.limits.max_ttl = bound;
    config.settings.queue.max_reconcile_time = bound;
    config
}

/// A subscription to a core-group resource by kind, in one namespace.
pub fn subscription(version: &str, kind: &str, namespace: &str) -> Subscription {
    Subscription {
        resource: Some(ResourceRef {
            version: version.into(),
            kind: kind.into(),
            ..ResourceRef::default()
        }),
        namespace: namespace.into(),
        ..Subscription::default()
    }
}

/// A session opened on a test dispatcher.
#[derive(Debug, Clone)]
pub struct TestSession {
    /// The client it uses.
    pub client: DispatcherClient<AuthChannel>,
    /// Its id.
    pub id: String,
}

impl TestSession {
    /// Opens a session of `replica` in `group` with `subscriptions`.
    pub async fn open(
        dispatcher: &TestDispatcher,
        group: &str,
        replica: &str,
        subscriptions: Vec<Subscription>,
    ) -> Result<Self, tonic::Status> {
        Self::open_as(
            dispatcher,
            &crate::credentials(),
            group,
            replica,
            subscriptions,
        )
        .await
    }

    /// Opens a session of `replica` in `group` with `subscriptions` that lives `ttl` past each
    /// call (within the dispatcher's maximum).
    pub async fn open_for(
        dispatcher: &TestDispatcher,
        group: &str,
        replica: &str,
        subscriptions: Vec<Subscription>,
        ttl: Duration,
    ) -> Result<Self, tonic::Status> {
        let request = OpenSessionRequest {
            group: group.into(),
            replica_id: replica.into(),
            subscriptions,
            ttl: prost_types::Duration::try_from(ttl).ok(),
            ..Default::default()
        };
        Self::open_request(dispatcher, request).await
    }

    /// Opens a session of `replica` in `group` with `subscriptions` whose client says it takes
    /// `capabilities` (`kube_dispatch_proto::capabilities`).
    pub async fn open_with_capabilities(
        dispatcher: &TestDispatcher,
        group: &str,
        replica: &str,
        subscriptions: Vec<Subscription>,
        capabilities: &[&str],
    ) -> Result<Self, tonic::Status> {
        let request = OpenSessionRequest {
            group: group.into(),
            replica_id: replica.into(),
            subscriptions,
            capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
            ..Default::default()
        };
        Self::open_request(dispatcher, request).await
    }

    /// Opens the session `request` asks for, as the tests' identity.
    async fn open_request(
        dispatcher: &TestDispatcher,
        request: OpenSessionRequest,
    ) -> Result<Self, tonic::Status> {
        let client = dispatcher.client_as(&crate::credentials()).await;
        Self::open_on(client, request).await
    }

    /// Opens the session `request` asks for through `client`.
    async fn open_on(
        mut client: DispatcherClient<AuthChannel>,
        request: OpenSessionRequest,
    ) -> Result<Self, tonic::Status> {
        let id = client.open_session(request).await?.into_inner().session_id;
        Ok(Self { client, id })
    }

    /// Opens a session as the identity `credentials` carry.
    pub async fn open_as(
        dispatcher: &TestDispatcher,
        credentials: &Credentials,
        group: &str,
        replica: &str,
        subscriptions: Vec<Subscription>,
    ) -> Result<Self, tonic::Status> {
        let client = dispatcher.client_as(credentials).await;
        Self::open_with(client, group, replica, subscriptions).await
    }

    /// Opens a session through `client` (of any dispatcher, a process of its own included).
    pub async fn open_with(
        client: DispatcherClient<AuthChannel>,
        group: &str,
        replica: &str,
        subscriptions: Vec<Subscription>,
    ) -> Result<Self, tonic::Status> {
        let request = OpenSessionRequest {
            group: group.into(),
            replica_id: replica.into(),
            subscriptions,
            ttl: None,
            ..Default::default()
        };
        Self::open_on(client, request).await
    }

    /// Polls once, acknowledging `acks` as successes.
    pub async fn poll_acking(
        &mut self,
        acks: &[u64],
        wait: Duration,
    ) -> Result<Vec<ReconcileRequest>, tonic::Status> {
        let acks = acks
            .iter()
            .map(|id| AckItem {
                delivery_id: *id,
                outcome: Some(ack_item::Outcome::Success(Default::default())),
                memo: Vec::new(),
            })
            .collect();
        self.poll_with(acks, wait).await
    }

    /// Polls once with arbitrary acks.
    pub async fn poll_with(
        &mut self,
        acks: Vec<AckItem>,
        wait: Duration,
    ) -> Result<Vec<ReconcileRequest>, tonic::Status> {
        Ok(self
            .client
            .poll(PollRequest {
                session_id: self.id.clone(),
                max_items: 0,
                wait: prost_types::Duration::try_from(wait).ok(),
                acks,
                max_bytes: 0,
                ended_sessions: Vec::new(),
            })
            .await?
            .into_inner()
            .requests)
    }

    /// Polls without acknowledging until something arrives, for at most `timeout`; the
    /// deliveries stay in flight on this session.
    pub async fn hold(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<ReconcileRequest>, tonic::Status> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let got = self.poll_acking(&[], Duration::from_secs(2)).await?;
            if !got.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(got);
            }
        }
    }

    /// Polls, acknowledging everything as it arrives, until `done` holds for what was received
    /// so far or `timeout` passes. Returns everything received.
    pub async fn collect_until(
        &mut self,
        timeout: Duration,
        done: impl Fn(&[ReconcileRequest]) -> bool,
    ) -> Vec<ReconcileRequest> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut got: Vec<ReconcileRequest> = Vec::new();
        let mut acks: Vec<u64> = Vec::new();
        while !done(&got) && tokio::time::Instant::now() < deadline {
            let batch = self
                .poll_acking(&acks, Duration::from_millis(500))
                .await
                .expect("poll");
            acks = batch.iter().map(|r| r.delivery_id).collect();
            got.extend(batch);
        }
        self.ack(&acks).await.expect("ack");
        got
    }

    /// Acknowledges deliveries as successes without polling.
    pub async fn ack(&mut self, ids: &[u64]) -> Result<(), tonic::Status> {
        if ids.is_empty() {
            return Ok(());
        }
        let acks = ids
            .iter()
            .map(|id| AckItem {
                delivery_id: *id,
                outcome: Some(ack_item::Outcome::Success(Default::default())),
                memo: Vec::new(),
            })
            .collect();
        self.client
            .ack(AckRequest {
                session_id: self.id.clone(),
                acks,
                ended_sessions: Vec::new(),
                stopping: false,
            })
            .await?;
        Ok(())
    }

    /// Tells the dispatcher this session's replica is stopping (`AckRequest.stopping`).
    pub async fn stopping(&mut self) -> Result<(), tonic::Status> {
        self.client
            .ack(AckRequest {
                session_id: self.id.clone(),
                stopping: true,
                ..AckRequest::default()
            })
            .await?;
        Ok(())
    }
}
