//! The world the chaos suite runs: dispatchers, load balancers and replicas in this process, each
//! behind its fault proxy.

use std::{collections::BTreeMap, time::Duration};

use kube_dispatch_dispatcher::config::{Membership, ServeConfig};

use super::{BOUND, DISPATCHERS, Failure, IDLE_GRACE, WARM_UP, checker::start_checker};
use crate::{
    TestNamespace,
    dispatcher::{TestDispatcher, lease_membership, test_config},
    faultproxy::{Fault, FaultProxy},
    isolated::{ApiAccess, Isolated},
    journal::Journal,
    loadbalancer::TestLoadBalancer,
};

pub(super) struct DispatcherSlot {
    pub(super) running: Option<TestDispatcher>,
    /// Controllers to dispatcher.
    pub(super) front: FaultProxy,
    /// Dispatcher to API server.
    pub(super) api: FaultProxy,
}

pub(super) struct World {
    pub(super) namespaces: Vec<TestNamespace>,
    pub(super) label: String,
    pub(super) journal: Journal,
    pub(super) dispatchers: BTreeMap<usize, DispatcherSlot>,
    pub(super) balancers: Vec<Option<TestLoadBalancer>>,
    /// The load balancers' Service: forwards to a live one.
    pub(super) service: FaultProxy,
    pub(super) replicas: BTreeMap<String, Option<Isolated>>,
    pub(super) apiserver: std::net::SocketAddr,
    /// Objects per kind and namespace ([`Settings::objects`]).
    pub(super) objects: usize,
}

impl World {
    pub(super) fn lease_namespace(&self) -> String {
        self.namespaces[0].name().to_owned()
    }

    pub(super) fn config(&self, i: usize) -> ServeConfig {
        let name = format!("dispatcher-{i}");
        let mut config = test_config(&name, &[]);
        config.membership = lease_membership(&self.lease_namespace(), &name, BOUND);
        if let Membership::Leases(lease) = &mut config.membership {
            lease.warm_up = WARM_UP;
        }
        config.settings.limits.max_ttl = BOUND;
        config.settings.queue.max_reconcile_time = BOUND;
        config.drain_timeout = Duration::from_secs(5);
        config.settings.idle_group_grace = IDLE_GRACE;
        config
    }

    pub(super) async fn start_dispatcher(&mut self, i: usize) -> Result<(), Failure> {
        self.start_dispatcher_as(i, None).await
    }

    /// Starts dispatcher `i`, reaching the API server through its proxy as the admin, or
    /// directly as `token`'s identity when given (one the API server's priority and fairness
    /// can hold back).
    pub(super) async fn start_dispatcher_as(
        &mut self,
        i: usize,
        token: Option<String>,
    ) -> Result<(), Failure> {
        if !self.dispatchers.contains_key(&i) {
            let slot = DispatcherSlot {
                running: None,
                front: FaultProxy::start(self.apiserver).await?,
                api: FaultProxy::start(self.apiserver).await?,
            };
            self.dispatchers.insert(i, slot);
        }
        let config = self.config(i);
        let Some(slot) = self.dispatchers.get_mut(&i) else {
            return Ok(());
        };
        let api = match token {
            Some(token) => ApiAccess::Token(token),
            None => ApiAccess::Via(slot.api.addr),
        };
        let d = TestDispatcher::start_reaching(
            config,
            "127.0.0.1:0",
            api,
            Some(slot.front.addr.to_string()),
        )
        .await?;
        slot.front.retarget(d.addr);
        slot.running = Some(d);
        Ok(())
    }

    pub(super) async fn start_balancer(&mut self, i: usize) -> Result<(), Failure> {
        let lb = TestLoadBalancer::start(&self.lease_namespace()).await?;
        if self.balancers.iter().flatten().count() == 0 {
            self.service.retarget(lb.addr);
        }
        self.balancers[i] = Some(lb);
        Ok(())
    }

    pub(super) fn start_replica(&mut self, name: &str) -> Result<(), Failure> {
        let replica = start_checker(name, &self.label, self.service.addr, &self.journal)?;
        self.replicas.insert(name.to_owned(), Some(replica));
        Ok(())
    }

    /// Brings every component back and heals every proxy.
    pub(super) async fn heal_all(&mut self) -> Result<(), Failure> {
        for slot in self.dispatchers.values() {
            slot.front.set(Fault::None);
            slot.api.set(Fault::None);
        }
        for i in 0..DISPATCHERS {
            if self.dispatchers.get(&i).is_none_or(|s| s.running.is_none()) {
                self.start_dispatcher(i).await?;
            }
        }
        for i in 0..self.balancers.len() {
            if self.balancers[i].is_none() {
                self.start_balancer(i).await?;
            }
        }
        let names: Vec<String> = self.replicas.keys().cloned().collect();
        for name in names {
            if self.replicas.get(&name).is_some_and(Option::is_none) {
                self.start_replica(&name)?;
            }
        }
        Ok(())
    }

    pub(super) async fn stop_all(&mut self) {
        for (_, r) in std::mem::take(&mut self.replicas) {
            if let Some(r) = r {
                r.stop().await;
            }
        }
        for (_, slot) in std::mem::take(&mut self.dispatchers) {
            if let Some(d) = slot.running {
                d.stop().await;
            }
        }
        for lb in self.balancers.iter_mut() {
            if let Some(lb) = lb.take() {
                lb.stop().await;
            }
        }
    }
}
