//! The dispatcher's settings: client limits and what the group and session table needs.

use std::time::Duration;

use kube_dispatch_core::queue::QueueConfig;

/// Limits that protect the dispatcher from misbehaving clients. The defaults are the flags'
/// defaults (`kube-dispatch-dispatcher --help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most live sessions on this dispatcher.
    pub max_sessions: usize,
    /// Most live sessions per group.
    pub max_sessions_per_group: usize,
    /// Session ttl when the client asks for none.
    pub default_ttl: Duration,
    /// Bounds of a session ttl.
    pub min_ttl: Duration,
    /// Bounds of a session ttl.
    pub max_ttl: Duration,
    /// Longest a poll waits for work.
    pub max_poll_wait: Duration,
    /// Most requests one poll returns.
    pub max_poll_items: usize,
    /// Most acks in one request.
    pub max_acks: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_sessions: 10_000,
            max_sessions_per_group: 1_000,
            default_ttl: Duration::from_secs(10),
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(30),
            max_poll_wait: Duration::from_secs(5),
            max_poll_items: 1_000,
            max_acks: 10_000,
        }
    }
}

/// Settings of the dispatcher core.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This dispatcher's identity on the ring.
    pub identity: String,
    /// Client limits.
    pub limits: Limits,
    /// Queue behaviour of every group.
    pub queue: QueueConfig,
    /// Every key is resynced once per interval; zero disables resync.
    pub resync_interval: Duration,
    /// A group with no session is dropped (and its watches released) after this long.
    pub idle_group_grace: Duration,
    /// Every this long, each controller group whose queue changed logs a `queue status` line
    /// (keys known, ready, in flight, sessions); zero disables it.
    pub status_interval: Duration,
    /// Most deletions of keys owned by other dispatchers each group remembers, so a key that
    /// moves here is not lost if it was deleted in transit
    /// (`kube_dispatch_core::recent_deletions`); about 100 bytes each.
    pub max_recent_deletions: usize,
}
