//! The objects this replica reconciled last, so that a delivery of an object at a version the
//! replica already holds needs no read.
//!
//! A reconcile that writes an object's children makes the dispatcher deliver the object again
//! once their changes come back from its watch (reason `OWNED`). Such a delivery carries the
//! object as the dispatcher's watch last showed it where the dispatcher could keep it (within
//! half its body budget; a 0.1.0 dispatcher never does), and otherwise no body: the change was a
//! child's, not the object's. Without this, the replica would read the object from the API
//! server once more for each of them, where a cached controller reads its cache. And when the
//! reconcile also wrote the object itself, the version it wrote, kept here, is newer than the
//! one the delivery names until the dispatcher's watch shows the write: the newer one is
//! handed to the reconcile, as a fresh read would have been. The request's `resource_version` is the last one the dispatcher saw for the object:
//! if this replica reconciled the object at exactly that version, it is the same object (a
//! resourceVersion names one state of one object), and it is handed to the reconcile again.
//!
//! A reconcile's own write of its object ([`crate::precondition`]'s writes) replaces the object
//! kept with what the API server answered: the change the write made comes back from the
//! dispatcher's watch as a delivery at that version (`MODIFIED`, or `OWNED` once children
//! change), and is handed the written object without a read.
//!
//! Bounded by the JSON size of the objects kept, with their keys, versions, uids and a fixed
//! cost an entry ([`crate::Controller::recent_objects`]; decoded, an object takes some more; an
//! object a write answered counts at the size of the one it replaces), least recently used out
//! first; a key is forgotten when its object is deleted. Only ever a way to skip a read: a key
//! not found here is read as before.

use std::{
    any::Any,
    sync::{Arc, Mutex},
};

use kube::Resource;
use lru::LruCache;

use crate::own_writes::{OwnWrites, Written};

/// What an entry costs beside its strings and JSON (the map's node, the `Arc`, the strings'
/// headers), counted against the budget so that many small objects stay within it too.
const ENTRY_BYTES: usize = 128;

/// One object as last reconciled here.
struct Kept<K> {
    resource_version: String,
    /// The object's uid: a request naming another uid is another object.
    uid: String,
    object: Arc<K>,
    /// What it counts for against the budget: its JSON, the strings beside it and
    /// [`ENTRY_BYTES`].
    weight: usize,
}

/// The objects last reconciled, by request key.
pub(crate) struct Recent<K>(Option<Mutex<Held<K>>>);

/// The map and its byte count.
struct Held<K> {
    map: LruCache<String, Kept<K>>,
    bytes: usize,
    budget: usize,
}

impl<K> Recent<K> {
    /// Keeps objects up to `bytes` of JSON in all; `0` keeps none.
    pub(crate) fn new(bytes: u64) -> Self {
        Self((bytes > 0).then(|| {
            Mutex::new(Held {
                map: LruCache::unbounded(),
                bytes: 0,
                budget: usize::try_from(bytes).unwrap_or(usize::MAX),
            })
        }))
    }

    fn lock(&self) -> Option<std::sync::MutexGuard<'_, Held<K>>> {
        Some(self.0.as_ref()?.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The object of `key` if it was reconciled here at `resource_version`, and has the uid
    /// `uid` when that is known.
    pub(crate) fn get(&self, key: &str, resource_version: &str, uid: &str) -> Option<Arc<K>> {
        if resource_version.is_empty() {
            return None;
        }
        let mut kept = self.lock()?;
        let entry = kept.map.get(key)?;
        (entry.resource_version == resource_version && (uid.is_empty() || entry.uid == uid))
            .then(|| entry.object.clone())
    }

    /// The object of `key` if the one kept has the uid `uid` and a version newer than
    /// `resource_version`: a reconcile here wrote it, and the dispatcher's watch has not shown
    /// that write yet. Versions are compared as the integers they are (Kubernetes 1.35 and
    /// newer make them comparable); a version that is not one is never newer.
    pub(crate) fn newer(&self, key: &str, resource_version: &str, uid: &str) -> Option<Arc<K>> {
        let asked: u64 = resource_version.parse().ok()?;
        if uid.is_empty() {
            return None;
        }
        let mut kept = self.lock()?;
        let entry = kept.map.get(key)?;
        let held: u64 = entry.resource_version.parse().ok()?;
        (entry.uid == uid && held > asked).then(|| entry.object.clone())
    }

    /// Keeps `object` (`json_len` bytes as JSON) for `key` at `resource_version`, with its
    /// `uid`; an object with no version, or larger than the whole budget, is not kept. The
    /// least recently used go until the rest fit.
    pub(crate) fn keep(
        &self,
        key: &str,
        (resource_version, uid): (&str, &str),
        object: Arc<K>,
        json_len: usize,
    ) {
        let Some(mut kept) = self.lock() else { return };
        if let Some(old) = kept.map.pop(key) {
            kept.bytes -= old.weight;
        }
        let weight = ENTRY_BYTES + key.len() + resource_version.len() + uid.len() + json_len;
        if resource_version.is_empty() || weight > kept.budget {
            return;
        }
        while kept.bytes.saturating_add(weight) > kept.budget {
            let Some((_, out)) = kept.map.pop_lru() else {
                break;
            };
            kept.bytes -= out.weight;
        }
        kept.bytes += weight;
        kept.map.put(
            key.to_owned(),
            Kept {
                resource_version: resource_version.to_owned(),
                uid: uid.to_owned(),
                object,
                weight,
            },
        );
    }

    /// Replaces the object kept for `key` with `object`, at `resource_version`, if the one kept
    /// has the uid `uid` (the same object, which a reconcile here wrote): counted at the kept
    /// one's size. Nothing is kept when nothing was.
    pub(crate) fn update(&self, key: &str, (resource_version, uid): (&str, &str), object: Arc<K>) {
        let Some(mut kept) = self.lock() else { return };
        let Some(entry) = kept.map.get_mut(key) else {
            return;
        };
        if resource_version.is_empty() || uid.is_empty() || entry.uid != uid {
            return;
        }
        // Versions differ by a few bytes at most: the budget may be passed by those.
        let old = entry.weight;
        entry.weight = old - entry.resource_version.len() + resource_version.len();
        entry.resource_version = resource_version.to_owned();
        entry.object = object;
        let new = entry.weight;
        kept.bytes = kept.bytes - old + new;
    }

    /// Forgets `key` (its object was deleted).
    pub(crate) fn forget(&self, key: &str) {
        if let Some(mut kept) = self.lock()
            && let Some(old) = kept.map.pop(key)
        {
            kept.bytes -= old.weight;
        }
    }
}

/// The objects kept for the reconcile of `key`, and its writes.
pub(crate) struct KeepOwn<K> {
    pub(crate) key: String,
    pub(crate) recent: Arc<Recent<K>>,
    pub(crate) written: Arc<Written>,
}

impl<K: Resource + Clone + Send + Sync + 'static> OwnWrites for KeepOwn<K> {
    fn wrote(&self, object: &dyn Any) {
        if let Some(object) = object.downcast_ref::<K>() {
            let meta = object.meta();
            let version = meta.resource_version.as_deref().unwrap_or_default();
            let uid = meta.uid.as_deref().unwrap_or_default();
            self.recent
                .update(&self.key, (version, uid), Arc::new(object.clone()));
        }
    }

    fn wrote_resource(&self, resource: &str, version: u64) {
        self.written.note(&self.key, resource, version);
    }

    fn written_newer_than(&self, resource: &str, shown: u64) -> Option<u64> {
        self.written.newer_than(&self.key, resource, shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_handed_back_only_at_the_version_it_was_kept_at() {
        let recent = Recent::new(1 << 20);
        recent.keep("k", ("7", "u1"), Arc::new("seven"), 100);
        assert_eq!(recent.get("k", "7", "").as_deref(), Some(&"seven"));
        assert_eq!(recent.get("k", "7", "u1").as_deref(), Some(&"seven"));
        assert_eq!(
            recent.get("k", "7", "u2"),
            None,
            "another object of the name"
        );
        assert_eq!(recent.get("k", "8", ""), None, "a newer version is read");
        assert_eq!(recent.get("k", "", ""), None, "no version named: read");
        assert_eq!(recent.get("other", "7", ""), None);
        recent.keep("k", ("8", "u1"), Arc::new("eight"), 100);
        assert_eq!(recent.get("k", "7", ""), None, "replaced");
        assert_eq!(recent.get("k", "8", "").as_deref(), Some(&"eight"));
        // The reconcile's own write of the object: kept at the version it made.
        recent.update("k", ("9", "u1"), Arc::new("nine"));
        assert_eq!(recent.get("k", "9", "u1").as_deref(), Some(&"nine"));
        recent.update("k", ("10", "u2"), Arc::new("another object"));
        recent.update("never-kept", ("10", "u1"), Arc::new("not kept"));
        assert_eq!(
            recent.get("k", "10", ""),
            None,
            "another uid is not the object kept"
        );
        assert_eq!(
            recent.get("never-kept", "10", ""),
            None,
            "only what was kept is replaced"
        );
        recent.forget("k");
        assert_eq!(recent.get("k", "8", ""), None, "deleted");
        recent.keep("k", ("", "u1"), Arc::new("none"), 100);
        assert_eq!(recent.get("k", "", ""), None, "no version, not kept");
    }

    /// An object a reconcile here wrote is newer than what a delivery for a child's change
    /// names until the dispatcher's watch shows the write: handed over then, and only for the
    /// same object at a version that is newer.
    #[test]
    fn an_object_written_here_is_newer_than_a_delivery_that_names_an_older_version() {
        let recent = Recent::new(1 << 20);
        recent.keep("k", ("7", "u1"), Arc::new("seven"), 100);
        recent.update("k", ("8", "u1"), Arc::new("eight, written here"));
        assert_eq!(
            recent.newer("k", "7", "u1").as_deref(),
            Some(&"eight, written here")
        );
        assert_eq!(recent.newer("k", "8", "u1"), None, "the same version");
        assert_eq!(recent.newer("k", "9", "u1"), None, "an older one");
        assert_eq!(recent.newer("k", "7", "u2"), None, "another object");
        assert_eq!(recent.newer("k", "7", ""), None, "no uid named");
        assert_eq!(recent.newer("k", "x", "u1"), None, "not a version");
        // Numbers, not strings: "10" is newer than "9".
        recent.update("k", ("10", "u1"), Arc::new("ten"));
        assert_eq!(recent.newer("k", "9", "u1").as_deref(), Some(&"ten"));
        assert_eq!(Recent::<&str>::new(0).newer("k", "7", "u1"), None);
    }

    #[test]
    fn nothing_is_kept_with_no_budget() {
        let recent = Recent::new(0);
        recent.keep("k", ("7", ""), Arc::new(7), 10);
        assert_eq!(recent.get("k", "7", ""), None);
    }

    #[test]
    fn the_budget_bounds_what_is_kept() {
        let recent = Recent::new(10_000);
        for i in 0..100 {
            recent.keep(&format!("k{i}"), ("1", ""), Arc::new(i), 1000);
        }
        let bytes = recent.lock().expect("kept").bytes;
        assert!(bytes <= 10_000, "{bytes}");
        let held = (0..100)
            .filter(|i| recent.get(&format!("k{i}"), "1", "").is_some())
            .count();
        assert!(
            (1..=10).contains(&held),
            "{held} of 100 objects of 1000 bytes"
        );
    }
}
