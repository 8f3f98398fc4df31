//! The journal replica: a controller that records each reconcile in the journal, run as a test's
//! replica of a group.

use std::{sync::Arc, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_dispatch_controller::{Action, Controller, DispatcherService, Health};
use tokio_util::sync::CancellationToken;

use crate::{
    FixtureError,
    isolated::Isolated,
    journal::{Journal, key_of, rv_of},
};

#[derive(Debug, thiserror::Error)]
#[error("unreachable")]
pub(super) struct Never;

pub(super) struct Ctx {
    journal: Journal,
    replica: String,
    /// How long each reconcile takes; `None`: until it is cancelled.
    work: Option<Duration>,
}

/// A replica of the journal controller: it reconciles the ConfigMaps of a namespace, records
/// every reconcile in a [`Journal`], and takes a set time for each (or never finishes one, until
/// its session is lost). The one replica the integration tests start:
///
/// ```no_run
/// # use std::time::Duration;
/// # use kube_dispatch_tests::journal::{Journal, JournalReplica};
/// # fn example(lb: std::net::SocketAddr) -> Result<(), kube_dispatch_tests::FixtureError> {
/// let journal = Journal::default();
/// let replica = JournalReplica::new("ns", "group", "replica-0", &journal)
///     .load_balancer(lb)
///     .work(Duration::from_millis(10))
///     .isolated()?;
/// replica.kill();
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct JournalReplica {
    namespace: String,
    group: String,
    name: String,
    journal: Journal,
    work: Option<Duration>,
    ttl: Duration,
    concurrency: usize,
    target: Option<Target>,
    service: Option<DispatcherService>,
}

#[derive(Clone, Debug)]
pub(super) enum Target {
    LoadBalancer(std::net::SocketAddr),
    Dispatcher(String),
}

impl JournalReplica {
    /// Replica `name` of controller group `group` in `namespace`, recording in `journal`;
    /// by default instant reconciles, 4 at a time, 3 s sessions, and no dispatcher: set one with
    /// [`JournalReplica::load_balancer`] or [`JournalReplica::dispatcher`].
    pub fn new(namespace: &str, group: &str, name: &str, journal: &Journal) -> Self {
        Self {
            namespace: namespace.to_owned(),
            group: group.to_owned(),
            name: name.to_owned(),
            journal: journal.clone(),
            work: Some(Duration::ZERO),
            ttl: Duration::from_secs(3),
            concurrency: 4,
            target: None,
            service: None,
        }
    }

    /// Registers with the load balancer at `address`.
    pub fn load_balancer(mut self, address: std::net::SocketAddr) -> Self {
        self.target = Some(Target::LoadBalancer(address));
        self
    }

    /// Looks up `service` for dispatchers while the load balancer cannot be reached.
    pub fn dispatcher_service(mut self, service: DispatcherService) -> Self {
        self.service = Some(service);
        self
    }

    /// Polls the dispatcher at `address` (`host:port`) only.
    pub fn dispatcher(mut self, address: impl Into<String>) -> Self {
        self.target = Some(Target::Dispatcher(address.into()));
        self
    }

    /// Each reconcile takes `work`.
    pub fn work(mut self, work: Duration) -> Self {
        self.work = Some(work);
        self
    }

    /// Reconciles never finish, until cancelled (the session is lost, or the replica stops).
    pub fn hang(mut self) -> Self {
        self.work = None;
        self
    }

    /// Sessions of `ttl`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// At most `n` reconciles at a time.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// The replica's controller on `client`, and what its reconciles share.
    fn controller(self, client: kube::Client) -> (Controller<ConfigMap>, Arc<Ctx>) {
        let ctx = Arc::new(Ctx {
            journal: self.journal,
            replica: self.name.clone(),
            work: self.work,
        });
        let controller = Controller::<ConfigMap>::new(client, self.group)
            .namespace(self.namespace)
            .replica_id(self.name)
            .concurrency(self.concurrency)
            .session_ttl(self.ttl)
            .credentials(crate::credentials());
        let controller = match self.service {
            Some(service) => controller.dispatcher_service(service),
            None => controller,
        };
        let controller = match self.target {
            Some(Target::LoadBalancer(address)) => controller.load_balancer(address.to_string()),
            Some(Target::Dispatcher(address)) => controller.dispatchers([address]),
            None => panic!(
                "journal replica {:?} has nowhere to poll: call load_balancer() or dispatcher()",
                ctx.replica
            ),
        };
        (controller, ctx)
    }

    /// Starts the replica on a runtime of its own, so it can be killed as a crash would.
    pub fn isolated(self) -> Result<Isolated, FixtureError> {
        let name = self.name.clone();
        Isolated::spawn(&name, move |shutdown: CancellationToken| async move {
            let client = match crate::Cluster::shared().client().await {
                Ok(c) => c,
                Err(e) => panic!("test replica has no client: {e}"),
            };
            let (controller, ctx) = self.controller(client);
            run(controller, ctx, shutdown).await;
        })
    }

    /// Starts the replica on this runtime with `client`; it stops gracefully when the returned
    /// token is cancelled. Also returns its health.
    pub fn spawn(self, client: kube::Client) -> (CancellationToken, Health) {
        let stop = CancellationToken::new();
        let (controller, ctx) = self.controller(client);
        let health = controller.health();
        tokio::spawn(run(controller, ctx, stop.clone()));
        (stop, health)
    }
}

/// Runs `controller` until `stop` is cancelled, then stops gracefully.
pub(super) async fn run(controller: Controller<ConfigMap>, ctx: Arc<Ctx>, stop: CancellationToken) {
    controller
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(record, |_, _: &Never, _| Action::await_change(), ctx)
        .for_each(|_| async {})
        .await;
}

/// Ends a reconcile's record when dropped, so a reconcile the SDK cancels (its session was
/// lost) ends where it was cancelled.
#[derive(Debug)]
pub struct Running<'a> {
    journal: &'a Journal,
    index: usize,
}

impl Journal {
    /// Records the start of a reconcile (see [`Journal::begin_with`]); its end is recorded when
    /// the returned guard is dropped.
    pub fn start_reconcile(
        &self,
        key: String,
        resource_version: u64,
        deleted: bool,
        replica: &str,
    ) -> Running<'_> {
        Running {
            journal: self,
            index: self.begin_with(key, resource_version, deleted, replica),
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.journal.end(self.index);
    }
}

pub(super) async fn record(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Never> {
    let _running = ctx
        .journal
        .start_reconcile(key_of(&cm), rv_of(&cm), false, &ctx.replica);
    match ctx.work {
        Some(work) => tokio::time::sleep(work).await,
        None => std::future::pending().await,
    }
    Ok(Action::await_change())
}
