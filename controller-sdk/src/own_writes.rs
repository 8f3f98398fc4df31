//! What the reconcile running in a task wrote, for what it reads next.
//!
//! A reconcile's write of its own object replaces the object its replica keeps as last
//! reconciled (the runtime's recent objects). Its writes of other objects, children above all,
//! are noted by resource ([`Written`]), because the dispatcher delivers the owner again once
//! its watch shows the first of them and may not show the rest yet: a request that lists the
//! children completely as the dispatcher knows them would miss the ones just made, and
//! [`crate::reads::children`] lists instead while a write is newer than what its request shows.
//! The writes are seen by the client [`crate::Controller::client`] gives
//! ([`crate::api_requests::counted`]) and by [`crate::precondition`].

use std::{
    any::Any,
    sync::{Arc, Mutex},
};

use lru::LruCache;

/// How [`Written`] names the objects of kind group `group`, plural `plural`, in `namespace`
/// (empty for a cluster-scoped kind): a request's children in one namespace show nothing of
/// the writes made in another.
pub(crate) fn resource_key(group: &str, plural: &str, namespace: &str) -> String {
    format!("{group}/{plural}/{namespace}")
}

/// The most keys whose writes [`Written`] remembers.
const WRITTEN_KEYS: usize = 4096;

/// The newest resourceVersion this process's reconciles of each key wrote of a child, by
/// resource and namespace ([`resource_key`]): until a request for the key lists children there
/// at least as new, it may not show what those writes made (the dispatcher's watch has not
/// shown them yet), and [`crate::reads::children`] lists rather than trusting it.
///
/// Bounded by [`WRITTEN_KEYS`] entries of a key, a resource and a version (some 200 bytes
/// each); an entry goes once a request shows its write, or its key's object is deleted; past
/// the bound the oldest goes first, and its key's reads are then as its requests show them,
/// as a cache behind its own writes would be.
pub(crate) struct Written(Mutex<LruCache<(String, String), u64>>);

impl Written {
    pub(crate) fn new() -> Self {
        Self(Mutex::new(LruCache::new(
            std::num::NonZeroUsize::new(WRITTEN_KEYS).unwrap_or(std::num::NonZeroUsize::MIN),
        )))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<(String, String), u64>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reconcile of `key` wrote an object of `resource`, and the API server answered it at
    /// `version`.
    pub(crate) fn note(&self, key: &str, resource: &str, version: u64) {
        let mut written = self.lock();
        let entry = (key.to_owned(), resource.to_owned());
        let newest = written.get(&entry).copied().unwrap_or(0).max(version);
        written.put(entry, newest);
    }

    /// The newest version a reconcile of `key` wrote of `resource` if it is newer than
    /// `shown`, the newest its request shows of that resource; one the request shows is
    /// forgotten.
    pub(crate) fn newer_than(&self, key: &str, resource: &str, shown: u64) -> Option<u64> {
        let mut written = self.lock();
        let entry = (key.to_owned(), resource.to_owned());
        let version = *written.peek(&entry)?;
        if version > shown {
            return Some(version);
        }
        written.pop(&entry);
        None
    }

    /// Forgets the writes of `key` (its object was deleted).
    pub(crate) fn forget(&self, key: &str) {
        let mut written = self.lock();
        let of_key: Vec<(String, String)> = written
            .iter()
            .filter(|((k, _), _)| k == key)
            .map(|(entry, _)| entry.clone())
            .collect();
        for entry in of_key {
            written.pop(&entry);
        }
    }
}

/// Whoever keeps what the reconcile running in this task wrote: its controller's objects
/// last reconciled and its [`Written`], for its request key.
pub(crate) trait OwnWrites: Send + Sync {
    /// The reconcile wrote `object` (of some type), and the API server answered this.
    fn wrote(&self, object: &dyn Any);
    /// The reconcile wrote a child of `resource` ([`resource_key`]), answered at `version`.
    fn wrote_resource(&self, resource: &str, version: u64);
    /// [`Written::newer_than`] for the reconcile's key.
    fn written_newer_than(&self, resource: &str, shown: u64) -> Option<u64>;
}

tokio::task_local! {
    /// The objects kept for the reconcile running in this task.
    pub(crate) static OWN_WRITES: Arc<dyn OwnWrites>;
}

/// A reconcile's write answered `object`: if it is the reconcile's own object (its type, and
/// the uid of the object kept for its key), the object kept for its key becomes this one.
/// Outside a reconcile, nothing.
pub(crate) fn wrote<W: Any>(object: &W) {
    let _ = OWN_WRITES.try_with(|writes| writes.wrote(object));
}

/// Whether this task runs a reconcile.
pub(crate) fn in_reconcile() -> bool {
    OWN_WRITES.try_with(|_| ()).is_ok()
}

/// A reconcile's write of a child of `resource` ([`resource_key`]) was answered at `version`.
/// Outside a reconcile, nothing.
pub(crate) fn wrote_resource(resource: &str, version: u64) {
    let _ = OWN_WRITES.try_with(|writes| writes.wrote_resource(resource, version));
}

/// The newest version this reconcile's key wrote of `resource` here, if newer than `shown`
/// ([`Written::newer_than`]). Outside a reconcile, `None`.
pub(crate) fn written_newer_than(resource: &str, shown: u64) -> Option<u64> {
    OWN_WRITES
        .try_with(|writes| writes.written_newer_than(resource, shown))
        .ok()
        .flatten()
}

/// Runs `work` as a reconcile of `key` whose writes of resources are noted in `written` (its
/// writes of its own object are not kept).
#[cfg(test)]
pub(crate) async fn as_reconcile_of<F: std::future::Future>(
    key: &str,
    written: Arc<Written>,
    work: F,
) -> F::Output {
    struct Noted {
        key: String,
        written: Arc<Written>,
    }
    impl OwnWrites for Noted {
        fn wrote(&self, _: &dyn Any) {}
        fn wrote_resource(&self, resource: &str, version: u64) {
            self.written.note(&self.key, resource, version);
        }
        fn written_newer_than(&self, resource: &str, shown: u64) -> Option<u64> {
            self.written.newer_than(&self.key, resource, shown)
        }
    }
    let own: Arc<dyn OwnWrites> = Arc::new(Noted {
        key: key.to_owned(),
        written,
    });
    OWN_WRITES.scope(own, work).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key's write of a resource stays newer than its requests until one shows it; then
    /// it is forgotten, as it is when its key's object is deleted.
    #[test]
    fn a_write_is_newer_than_a_request_until_one_shows_it() {
        let written = Written::new();
        assert_eq!(written.newer_than("k", "/secrets", 0), None, "none made");
        written.note("k", "/secrets", 12);
        written.note("k", "/secrets", 11);
        written.note("k", "apps/deployments", 30);
        assert_eq!(written.newer_than("k", "/secrets", 10), Some(12));
        assert_eq!(written.newer_than("other", "/secrets", 10), None);
        assert_eq!(written.newer_than("k", "/secrets", 12), None, "shown");
        assert_eq!(written.newer_than("k", "/secrets", 10), None, "forgotten");
        assert_eq!(written.newer_than("k", "apps/deployments", 29), Some(30));
        written.forget("k");
        assert_eq!(written.newer_than("k", "apps/deployments", 29), None);
        for i in 0..=WRITTEN_KEYS {
            written.note(&format!("k{i}"), "/secrets", 5);
        }
        assert_eq!(written.lock().len(), WRITTEN_KEYS, "bounded");
        assert_eq!(written.newer_than("k0", "/secrets", 1), None, "oldest out");
        assert_eq!(written.newer_than("k1", "/secrets", 1), Some(5));
    }
}
