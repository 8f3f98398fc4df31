//! The writer that creates, updates and deletes objects all along, and what it expects to be
//! reconciled.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use rand::{RngExt as _, SeedableRng as _, rngs::StdRng};
use tokio::{sync::Mutex, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    Failure,
    checker::{key, rv},
    world::World,
};
use crate::{Cluster, FixtureError, Widget, journal::Journal};

/// The writer's knowledge of what it wrote, for the final check.
#[derive(Default)]
pub(super) struct WriterState {
    /// Keys the writer last deleted, with the time just before the delete.
    pub(super) deleted: BTreeMap<String, Instant>,
    /// Widgets whose owned ConfigMap the writer changed last, with the time before the write.
    pub(super) owned: BTreeMap<String, Instant>,
    /// Keys that exist as far as the writer knows.
    pub(super) live: BTreeSet<String>,
    /// Deletions are held back (fault 18, while the controllers are away and coming back).
    pub(super) pause_deletions: bool,
}

/// What the journal must show at the end.
pub(super) struct Expected {
    pub(super) finals: BTreeMap<String, u64>,
    pub(super) deleted: BTreeMap<String, Instant>,
    pub(super) owned: BTreeMap<String, Instant>,
}

impl Expected {
    /// The final states not reconciled yet, and apart the deletions created and deleted
    /// again unseen ([`Report::unseen`]).
    pub(super) fn missing(&self, journal: &Journal) -> (Vec<String>, Vec<String>) {
        let mut missing = journal.unreconciled(&self.finals);
        let (unseen, deletions): (Vec<String>, Vec<String>) = journal
            .unreconciled_since(&self.deleted, true)
            .into_iter()
            .partition(|k| journal.last_view_is_deleted(k));
        missing.extend(deletions.into_iter().map(|k| format!("{k} (deleted)")));
        missing.extend(
            journal
                .unreconciled_since(&self.owned, false)
                .into_iter()
                .map(|k| format!("{k} (owned object changed)")),
        );
        (missing, unseen)
    }
}

impl WriterState {
    /// Expects a reconcile of `key` started after `at`, unless a later write already does.
    pub(super) fn owned_changed(&mut self, key: String, at: Instant) {
        let later = self.owned.get(&key).is_some_and(|t| *t > at);
        if !later {
            self.owned.insert(key, at);
        }
    }

    /// The final states, read from the API server.
    pub(super) async fn expectations(&self, world: &World) -> Result<Expected, Failure> {
        let client = Cluster::shared().client().await?;
        let mut finals = BTreeMap::new();
        let params = ListParams::default().labels(&world.label);
        for ns in &world.namespaces {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
            for cm in cms.list(&params).await? {
                // Owned children are the garbage collector's to delete: only what the writer
                // wrote directly is checked.
                if cm.owner_references().is_empty() {
                    finals.insert(key("ConfigMap", &cm), rv(&cm));
                }
            }
            let widgets: Api<Widget> = Api::namespaced(client.clone(), ns.name());
            for w in widgets.list(&params).await? {
                finals.insert(key("Widget", &w), rv(&w));
            }
        }
        // A deletion counts only if the object is still gone.
        let deleted = self
            .deleted
            .iter()
            .filter(|(k, _)| !finals.contains_key(*k))
            .map(|(k, t)| (k.clone(), *t))
            .collect();
        let owned = self
            .owned
            .iter()
            .filter(|(k, _)| finals.contains_key(*k))
            .map(|(k, t)| (k.clone(), *t))
            .collect();
        Ok(Expected {
            finals,
            deleted,
            owned,
        })
    }
}

pub(super) struct Writer {
    pub(super) client_namespaces: Vec<String>,
    pub(super) label: String,
    pub(super) journal: Journal,
    pub(super) rng: StdRng,
    pub(super) objects: usize,
    pub(super) state: Arc<Mutex<WriterState>>,
}

impl Writer {
    pub(super) fn new(world: &World, seed: u64, objects: usize) -> Self {
        Self {
            client_namespaces: world
                .namespaces
                .iter()
                .map(|n| n.name().to_owned())
                .collect(),
            label: world.label.clone(),
            journal: world.journal.clone(),
            rng: StdRng::seed_from_u64(seed ^ 0x5eed),
            objects,
            state: Arc::new(Mutex::new(WriterState::default())),
        }
    }

    /// Writes until `stop`; returns the number of writes that succeeded. Writes that fail (the
    /// API server restarting) are skipped: the final check reads the final states back.
    pub(super) async fn run(
        mut self,
        period: Duration,
        stop: CancellationToken,
    ) -> Result<usize, FixtureError> {
        let (label_key, label_value) = self.label.split_once('=').unwrap_or_default();
        let writes = Writes {
            client: Cluster::shared().client().await?,
            params: PatchParams::apply("kube-dispatch-chaos").force(),
            labels: serde_json::json!({ label_key: label_value }),
        };
        let mut written = 0usize;
        let mut tick = tokio::time::interval(period);
        // Create everything first.
        let mut plan: Vec<(usize, usize, bool)> = Vec::new();
        for ns in 0..self.client_namespaces.len() {
            for i in 0..self.objects {
                plan.push((ns, i, false));
                plan.push((ns, i, true));
            }
        }
        let mut round = 0u64;
        loop {
            let (ns, i, widget, op) = if let Some((ns, i, widget)) = plan.pop() {
                (ns, i, widget, 0u32)
            } else {
                (
                    self.rng.random_range(0..self.client_namespaces.len()),
                    self.rng.random_range(0..self.objects),
                    self.rng.random_range(0..5u32) < 2,
                    self.rng.random_range(0..10u32),
                )
            };
            tokio::select! {
                () = stop.cancelled() => return Ok(written),
                _ = tick.tick() => {}
            }
            round += 1;
            let namespace = self.client_namespaces[ns].clone();
            let name = format!("obj-{i}");
            let kind = if widget { "Widget" } else { "ConfigMap" };
            let key = format!("{kind}/{namespace}/{name}");
            let (exists, may_delete) = {
                let s = self.state.lock().await;
                (s.live.contains(&key), !s.pause_deletions)
            };
            let target = Target {
                key,
                namespace,
                name,
                round,
                before: Instant::now(),
            };
            // ConfigMaps are deleted too. Widgets are not: a deletion found by a re-list
            // reaches the reconciler as a tombstone only for types that can be built from
            // metadata alone, and a Widget's spec is required.
            let outcome = if exists && may_delete && op < 2 && !widget {
                self.delete(&writes, &target).await
            } else if widget && exists && op < 4 {
                self.change_child(&writes, &target).await
            } else {
                self.apply(&writes, &target, widget).await
            };
            match outcome {
                Ok(()) => written += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    // Deleted meanwhile (a child's owner, or a retried delete).
                    self.state.lock().await.live.remove(&target.key);
                }
                Err(_) => {
                    // The API server may be restarting. The final states are read back at the
                    // end; a write whose answer was lost may still have happened, so forget
                    // what this one meant for the checks that rely on the writer's memory.
                    let mut s = self.state.lock().await;
                    s.deleted.remove(&target.key);
                    s.owned.remove(&target.key);
                }
            }
        }
    }

    /// Deletes the ConfigMap `target`.
    async fn delete(&self, writes: &Writes, target: &Target) -> Result<(), kube::Error> {
        let api: Api<ConfigMap> = Api::namespaced(writes.client.clone(), &target.namespace);
        api.delete(&target.name, &DeleteParams::default()).await?;
        let mut s = self.state.lock().await;
        s.live.remove(&target.key);
        s.deleted.insert(target.key.clone(), target.before);
        self.journal.deleted(target.key.clone());
        s.owned.remove(&target.key);
        Ok(())
    }

    /// Changes the ConfigMap the Widget `target` owns, and only that: the owner must be
    /// reconciled.
    async fn change_child(&self, writes: &Writes, target: &Target) -> Result<(), kube::Error> {
        let Target {
            namespace, name, ..
        } = target;
        let api: Api<Widget> = Api::namespaced(writes.client.clone(), namespace);
        let owner = api.get(name).await?;
        let child = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": format!("{name}-child"),
                "labels": writes.labels,
                "ownerReferences": [{
                    "apiVersion": "test.kube-dispatch.dev/v1",
                    "kind": "Widget",
                    "name": name,
                    "uid": owner.uid(),
                    "controller": true,
                }],
            },
            "data": { "round": target.round.to_string() },
        });
        let cms: Api<ConfigMap> = Api::namespaced(writes.client.clone(), namespace);
        cms.patch(
            &format!("{name}-child"),
            &writes.params,
            &Patch::Apply(&child),
        )
        .await?;
        self.state
            .lock()
            .await
            .owned_changed(target.key.clone(), target.before);
        Ok(())
    }

    /// Creates or changes the Widget or ConfigMap `target` (server-side apply).
    async fn apply(
        &self,
        writes: &Writes,
        target: &Target,
        widget: bool,
    ) -> Result<(), kube::Error> {
        let Target {
            namespace,
            name,
            round,
            ..
        } = target;
        let written = if widget {
            let w = serde_json::json!({
                "apiVersion": "test.kube-dispatch.dev/v1",
                "kind": "Widget",
                "metadata": { "name": name, "labels": writes.labels },
                "spec": { "size": round },
            });
            let api: Api<Widget> = Api::namespaced(writes.client.clone(), namespace);
            rv(&api.patch(name, &writes.params, &Patch::Apply(&w)).await?)
        } else {
            let cm = serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": name, "labels": writes.labels },
                "data": { "round": round.to_string() },
            });
            let api: Api<ConfigMap> = Api::namespaced(writes.client.clone(), namespace);
            rv(&api.patch(name, &writes.params, &Patch::Apply(&cm)).await?)
        };
        self.journal.wrote(target.key.clone(), written);
        let mut s = self.state.lock().await;
        s.live.insert(target.key.clone());
        s.deleted.remove(&target.key);
        Ok(())
    }
}

/// What every write of the writer uses.
struct Writes {
    client: kube::Client,
    params: PatchParams,
    /// The label the test's objects carry.
    labels: serde_json::Value,
}

/// The object one write is about.
struct Target {
    namespace: String,
    name: String,
    /// `Kind/namespace/name`, as the journal names it.
    key: String,
    /// The write's number, written into the object so that every write changes it.
    round: u64,
    /// Just before the write.
    before: Instant,
}
