//! In-process load balancers for integration tests, each on a runtime of its own.

use std::{net::SocketAddr, time::Duration};

use kube_dispatch_loadbalancer::service::{Config, Handles, serve};

use crate::{
    FixtureError,
    isolated::{Isolated, bind, spawn_server},
};

/// A load balancer running in this process.
#[derive(Debug)]
pub struct TestLoadBalancer {
    /// Where it serves gRPC.
    pub addr: SocketAddr,
    /// Its registry and leadership.
    pub handles: Handles,
    /// Its metrics registry.
    pub metrics: kube_dispatch_telemetry::metrics::Metrics,
    runner: Isolated,
}

impl TestLoadBalancer {
    /// Starts a load balancer for the dispatchers of `namespace` (where its leader Lease lives
    /// too), with a 3 s leader Lease, a 2 s replica grace and a 1 s settle as it starts to
    /// lead.
    pub async fn start(namespace: &str) -> Result<Self, FixtureError> {
        Self::start_with_lease(namespace, Duration::from_secs(3)).await
    }

    /// Starts one as [`TestLoadBalancer::start`] does, with a leader Lease of `duration` (at
    /// least 2 s).
    pub async fn start_with_lease(
        namespace: &str,
        duration: Duration,
    ) -> Result<Self, FixtureError> {
        Self::start_settling(namespace, duration, Duration::from_secs(1)).await
    }

    /// Starts one as [`TestLoadBalancer::start_with_lease`] does, waiting `settle` as it starts
    /// to lead before it places any replica (its `--leader-settle`).
    pub async fn start_settling(
        namespace: &str,
        duration: Duration,
        settle: Duration,
    ) -> Result<Self, FixtureError> {
        let (listener, addr) = bind("127.0.0.1:0")?;
        let config = Config {
            advertise_address: addr.to_string(),
            namespace: namespace.to_owned(),
            lease_name: "kube-dispatch-loadbalancer".into(),
            lease_duration: duration,
            lease_grace: Duration::from_secs(1),
            dispatcher_grace: Duration::from_millis(500),
            replica_grace: Duration::from_secs(2),
            leader_settle: settle,
            max_registrations: 100,
            max_registrations_per_identity: 100,
            transport: kube_dispatch_server::tls::Transport::Tls(crate::serving_tls(false)),
            server: Default::default(),
            authentication: Some(kube_dispatch_server::auth::AuthConfig::default()),
            readiness: Default::default(),
            group_owners: Default::default(),
            metrics: Default::default(),
        };
        let metrics = config.metrics.clone();
        let (runner, handles) = spawn_server(
            "loadbalancer",
            listener,
            None,
            |client, listener, shutdown, tx| serve(config, client, listener, shutdown, Some(tx)),
        )
        .await?;
        Ok(Self {
            addr,
            handles,
            metrics,
            runner,
        })
    }

    /// Waits until it leads, for at most `timeout`; returns whether it does.
    pub async fn leads_within(&mut self, timeout: Duration) -> bool {
        matches!(
            tokio::time::timeout(timeout, self.handles.leading.wait_for(|l| *l)).await,
            Ok(Ok(_))
        )
    }

    /// Whether it leads now.
    pub fn leads(&self) -> bool {
        *self.handles.leading.borrow()
    }

    /// Stops it gracefully (it releases leadership).
    pub async fn stop(self) {
        self.runner.stop().await;
    }

    /// Kills it as `kill -9` would.
    pub fn kill(self) {
        self.runner.kill();
    }
}
