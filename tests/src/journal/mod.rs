//! The checker's record of what happened: every reconcile (key, resourceVersion seen, replica,
//! start, end) and every write, and the verdicts drawn from them: overlapping reconciles of a
//! key, final states never reconciled, and the delay from each write to its reconcile.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::FixtureError;

mod replica;
pub use replica::{JournalReplica, Running};

/// One reconcile as a replica ran it.
#[derive(Clone, Debug)]
pub struct Reconcile {
    /// `namespace/name`.
    pub key: String,
    /// The resourceVersion the reconciler was given.
    pub resource_version: u64,
    /// The replica that ran it.
    pub replica: String,
    /// When it started.
    pub start: Instant,
    /// When it ended; `None` while running (or if its replica was killed before
    /// [`Journal::killed`] closed it).
    pub end: Option<Instant>,
    /// Whether the reconciler was given a deleted object.
    pub deleted: bool,
}

/// One write the writer made.
#[derive(Clone, Debug)]
pub struct Write {
    /// `namespace/name`.
    pub key: String,
    /// The resourceVersion the API server gave it.
    pub resource_version: u64,
    /// When the API server answered.
    pub at: Instant,
}

#[derive(Debug, Default)]
struct Entries {
    reconciles: Vec<Reconcile>,
    writes: Vec<Write>,
    /// Deletions the writer made: key, and when the API server answered.
    deletions: Vec<(String, Instant)>,
}

/// The shared record; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Journal(Arc<Mutex<Entries>>);

impl Journal {
    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the start of a reconcile; returns its index for [`Journal::end`].
    pub fn begin(&self, key: String, resource_version: u64, replica: &str) -> usize {
        self.begin_with(key, resource_version, false, replica)
    }

    /// [`Journal::begin`] of a reconcile that was given a deleted object when `deleted`.
    pub fn begin_with(
        &self,
        key: String,
        resource_version: u64,
        deleted: bool,
        replica: &str,
    ) -> usize {
        let mut e = self.entries();
        e.reconciles.push(Reconcile {
            key,
            resource_version,
            replica: replica.to_owned(),
            start: Instant::now(),
            end: None,
            deleted,
        });
        e.reconciles.len() - 1
    }

    /// The keys of `since` (key to a time just before its last write: a deletion, or a change
    /// of an owned object) with no reconcile of the key started after that time (a deleted one,
    /// when `deleted`).
    pub fn unreconciled_since(
        &self,
        since: &BTreeMap<String, Instant>,
        deleted: bool,
    ) -> Vec<String> {
        let entries = self.entries();
        since
            .iter()
            .filter(|(key, at)| {
                !entries
                    .reconciles
                    .iter()
                    .any(|r| &r.key == *key && r.start >= **at && (!deleted || r.deleted))
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Records the end of reconcile `index`.
    pub fn end(&self, index: usize) {
        if let Some(r) = self.entries().reconciles.get_mut(index) {
            r.end = Some(Instant::now());
        }
    }

    /// `replica` was killed now: its running reconciles end here.
    pub fn killed(&self, replica: &str) {
        let now = Instant::now();
        for r in &mut self.entries().reconciles {
            if r.replica == replica && r.end.is_none() {
                r.end = Some(now);
            }
        }
    }

    /// Whether the last reconcile of `key` was given a deleted object: the controllers' last
    /// view of it is "gone". A deletion not followed by a reconcile still leaves them at its
    /// final state when every version written since that reconcile went unseen: created and
    /// deleted again while no watch of its dispatcher could show it, as any level-triggered
    /// watcher (an informer's re-list too) may miss.
    pub fn last_view_is_deleted(&self, key: &str) -> bool {
        self.entries()
            .reconciles
            .iter()
            .filter(|r| r.key == key)
            .max_by_key(|r| r.start)
            .is_some_and(|r| r.deleted)
    }

    /// Records that the writer deleted `key` now.
    pub fn deleted(&self, key: String) {
        self.entries().deletions.push((key, Instant::now()));
    }

    /// What happened to `key`, oldest first, the last `most` events: each write (`w<rv>`),
    /// deletion (`del`) and reconcile (`r<rv>` by its replica, `r-del` for a deleted object,
    /// with its end), at seconds since `origin`. For a loss report: it shows whether the last
    /// reconcile came before or after the last write, and what it saw.
    pub fn history(&self, key: &str, origin: Instant, most: usize) -> String {
        let entries = self.entries();
        let at = |t: Instant| t.saturating_duration_since(origin).as_secs_f64();
        let mut events: Vec<(Instant, String)> = Vec::new();
        for w in entries.writes.iter().filter(|w| w.key == key) {
            events.push((w.at, format!("{:.2}s w{}", at(w.at), w.resource_version)));
        }
        for (_, t) in entries.deletions.iter().filter(|(k, _)| k == key) {
            events.push((*t, format!("{:.2}s del", at(*t))));
        }
        for r in entries.reconciles.iter().filter(|r| r.key == key) {
            let seen = if r.deleted {
                "r-del".to_owned()
            } else {
                format!("r{}", r.resource_version)
            };
            let end = r
                .end
                .map_or_else(|| "running".to_owned(), |e| format!("{:.2}s", at(e)));
            events.push((
                r.start,
                format!("{:.2}s {seen} by {} to {end}", at(r.start), r.replica),
            ));
        }
        events.sort_by_key(|(t, _)| *t);
        let skip = events.len().saturating_sub(most);
        events
            .into_iter()
            .skip(skip)
            .map(|(_, e)| e)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Records a write.
    pub fn wrote(&self, key: String, resource_version: u64) {
        self.entries().writes.push(Write {
            key,
            resource_version,
            at: Instant::now(),
        });
    }

    /// Every reconcile so far.
    pub fn reconciles(&self) -> Vec<Reconcile> {
        self.entries().reconciles.clone()
    }

    /// Number of reconciles so far.
    pub fn len(&self) -> usize {
        self.entries().reconciles.len()
    }

    /// Number of writes so far.
    pub fn writes_len(&self) -> usize {
        self.entries().writes.len()
    }

    /// Waits until `n` more writes than `since` were made, for at most `within`.
    pub async fn await_writes(
        &self,
        since: usize,
        n: usize,
        within: Duration,
    ) -> Result<(), crate::FixtureError> {
        crate::eventually(
            within,
            format!("{n} writes after the first {since}"),
            || std::future::ready((self.writes_len() >= since + n).then_some(())),
        )
        .await
    }

    /// The reconciles running now.
    pub fn running(&self) -> Vec<Reconcile> {
        self.entries()
            .reconciles
            .iter()
            .filter(|r| r.end.is_none())
            .cloned()
            .collect()
    }

    /// Whether nothing was reconciled yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pairs of reconciles of one key that overlapped in time (a reconcile still running counts
    /// as running until now).
    pub fn overlaps(&self) -> Vec<(Reconcile, Reconcile)> {
        let now = Instant::now();
        let mut by_key: HashMap<&str, Vec<&Reconcile>> = HashMap::new();
        let entries = self.entries();
        for r in &entries.reconciles {
            by_key.entry(&r.key).or_default().push(r);
        }
        let mut found = Vec::new();
        for runs in by_key.values_mut() {
            runs.sort_by_key(|r| r.start);
            for pair in runs.windows(2) {
                if pair[0].end.unwrap_or(now) > pair[1].start {
                    found.push((pair[0].clone(), pair[1].clone()));
                }
            }
        }
        found
    }

    /// The keys of `finals` (key to final resourceVersion) with no reconcile that saw that
    /// version or a later one.
    pub fn unreconciled(&self, finals: &BTreeMap<String, u64>) -> Vec<String> {
        let mut newest: HashMap<&str, u64> = HashMap::new();
        let entries = self.entries();
        for r in &entries.reconciles {
            let n = newest.entry(&r.key).or_default();
            *n = (*n).max(r.resource_version);
        }
        finals
            .iter()
            .filter(|(key, rv)| newest.get(key.as_str()).is_none_or(|n| n < *rv))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Waits until every final state in `finals` was reconciled, for at most `timeout`;
    /// returns the keys still missing.
    pub async fn await_reconciled(
        &self,
        finals: &BTreeMap<String, u64>,
        timeout: Duration,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let missing = self.unreconciled(finals);
            if missing.is_empty() || Instant::now() >= deadline {
                return missing;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// For every write, the time until a reconcile of its key that saw it (or a later version)
    /// started; writes never followed by one are left out (see [`Journal::unreconciled`]).
    pub fn delays(&self) -> Vec<(Write, Duration)> {
        let entries = self.entries();
        let mut by_key: HashMap<&str, Vec<&Reconcile>> = HashMap::new();
        for r in &entries.reconciles {
            by_key.entry(&r.key).or_default().push(r);
        }
        for runs in by_key.values_mut() {
            runs.sort_by_key(|r| r.start);
        }
        entries
            .writes
            .iter()
            .filter_map(|w| {
                // A reconcile that saw this version or a later one cannot have started
                // before the write.
                let first = by_key
                    .get(w.key.as_str())?
                    .iter()
                    .find(|r| r.resource_version >= w.resource_version)?;
                Some((w.clone(), first.start.saturating_duration_since(w.at)))
            })
            .collect()
    }

    /// The final resourceVersion of every ConfigMap in `api`, keyed `namespace/name`.
    pub async fn finals(api: &Api<ConfigMap>) -> Result<BTreeMap<String, u64>, FixtureError> {
        Ok(api
            .list(&Default::default())
            .await?
            .into_iter()
            .map(|cm| (key_of(&cm), rv_of(&cm)))
            .collect())
    }
}

/// `namespace/name` of an object.
pub fn key_of(cm: &ConfigMap) -> String {
    format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any())
}

/// The resourceVersion of an object as a number (comparable within one resource, KEP-5504).
pub fn rv_of(cm: &ConfigMap) -> u64 {
    cm.resource_version()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

/// Writes ConfigMap `cm-<i>` with data `round`, recording the write in `journal`.
async fn write_one(
    api: &Api<ConfigMap>,
    i: usize,
    round: u64,
    journal: &Journal,
) -> Result<(), FixtureError> {
    let name = format!("cm-{i}");
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name },
        "data": { "round": round.to_string() },
    });
    let params = PatchParams::apply("kube-dispatch-tests").force();
    let written = api.patch(&name, &params, &Patch::Apply(&cm)).await?;
    journal.wrote(key_of(&written), rv_of(&written));
    Ok(())
}

/// Creates (or rewrites) ConfigMaps `cm-0..count` once, as round `round`.
pub async fn write_round(
    api: &Api<ConfigMap>,
    count: usize,
    round: u64,
    journal: &Journal,
) -> Result<(), FixtureError> {
    for i in 0..count {
        write_one(api, i, round, journal).await?;
    }
    Ok(())
}

/// Writes ConfigMaps `cm-0..count`: creates them, then updates one at a time, round robin,
/// every `period`, until `stop`. Every write goes to `journal`. Returns the number of writes.
pub async fn write_configmaps(
    api: Api<ConfigMap>,
    count: usize,
    period: Duration,
    journal: Journal,
    stop: CancellationToken,
) -> Result<usize, FixtureError> {
    write_round(&api, count, 0, &journal).await?;
    let mut writes = count;
    let mut tick = tokio::time::interval(period);
    for round in 1u64.. {
        for i in 0..count {
            tokio::select! {
                () = stop.cancelled() => return Ok(writes),
                _ = tick.tick() => {}
            }
            write_one(&api, i, round, &journal).await?;
            writes += 1;
        }
    }
    Ok(writes)
}

#[cfg(test)]
mod tests;
