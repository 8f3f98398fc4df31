//! Deletions of keys this dispatcher does not own, remembered for a bounded time and number.
//!
//! A key that moves here (its owner died or left, or this dispatcher joined) may have been
//! deleted after its old owner stopped delivering it and before this dispatcher adopted the ring
//! that gives it the key. A re-list cannot show a deletion, and the key was never in this
//! dispatcher's index, so without this memory the deletion would be lost. Every dispatcher sees
//! every event of its watches (it only filters them), so it remembers the recent deletions of
//! keys owned elsewhere; when the ring gives it such a key, the group delivers the deletion once
//! the handover lets it hand the key out (`HANDOVER.md`, "Deletions in transit").
//!
//! Pure logic: no I/O, time passed in.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

/// How long and how many deletions are remembered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecentDeletionsConfig {
    /// A deletion older than this is forgotten. It must cover the longest a key can be in
    /// transit unseen: a dead owner's Lease duration plus grace, plus the handover bound `T`
    /// (deletions its replicas may not have finished before it died).
    pub window: Duration,
    /// Most deletions remembered per controller group (about 100 bytes each); 0 remembers
    /// none (a fixed ring, where keys never move).
    pub capacity: usize,
}

impl RecentDeletionsConfig {
    /// Remembers nothing: for rings that never change.
    pub const NONE: Self = Self {
        window: Duration::ZERO,
        capacity: 0,
    };
}

/// The remembered deletions, by key hash.
#[derive(Debug)]
pub struct RecentDeletions {
    config: RecentDeletionsConfig,
    by_hash: HashMap<u64, (Arc<str>, Instant)>,
    /// Deletions not remembered because the memory was full of deletions within the window.
    overflowed: u64,
}

impl RecentDeletions {
    /// An empty memory.
    pub fn new(config: RecentDeletionsConfig) -> Self {
        Self {
            config,
            by_hash: HashMap::new(),
            overflowed: 0,
        }
    }

    /// Remembers that `key` (whose hash is `hash`) was deleted at `now`. Returns false when it
    /// could not be remembered: the memory is full of deletions within the window.
    pub fn deleted(&mut self, hash: u64, key: &str, now: Instant) -> bool {
        if self.config.capacity == 0 {
            return true;
        }
        if self.by_hash.len() >= self.config.capacity && !self.by_hash.contains_key(&hash) {
            self.prune(now);
            if self.by_hash.len() >= self.config.capacity {
                self.overflowed += 1;
                return false;
            }
        }
        self.by_hash.insert(hash, (Arc::from(key), now));
        true
    }

    /// The key with hash `hash` exists (again): forgets its deletion.
    pub fn exists(&mut self, hash: u64) {
        if !self.by_hash.is_empty() {
            self.by_hash.remove(&hash);
        }
    }

    /// Forgets the deletions older than the window.
    pub fn prune(&mut self, now: Instant) {
        let window = self.config.window;
        self.by_hash
            .retain(|_, (_, at)| now.saturating_duration_since(*at) <= window);
    }

    /// Removes and returns the keys, deleted within the window, that `take` accepts (given
    /// each key's hash and text).
    pub fn take_where(&mut self, now: Instant, take: impl Fn(u64, &str) -> bool) -> Vec<Arc<str>> {
        self.prune(now);
        let hashes: Vec<u64> = self
            .by_hash
            .iter()
            .filter(|(h, (key, _))| take(**h, key))
            .map(|(h, _)| *h)
            .collect();
        hashes
            .into_iter()
            .filter_map(|h| self.by_hash.remove(&h).map(|(key, _)| key))
            .collect()
    }

    /// The keys, deleted within the window, that `want` accepts (given each key's hash and
    /// text); they stay remembered.
    pub fn keys_where(&mut self, now: Instant, want: impl Fn(u64, &str) -> bool) -> Vec<Arc<str>> {
        self.prune(now);
        self.by_hash
            .iter()
            .filter(|(h, (key, _))| want(**h, key))
            .map(|(_, (key, _))| key.clone())
            .collect()
    }

    /// Number of deletions remembered.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Deletions that could not be remembered so far (memory full).
    pub fn overflowed(&self) -> u64 {
        self.overflowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(window_secs: u64, capacity: usize) -> RecentDeletions {
        RecentDeletions::new(RecentDeletionsConfig {
            window: Duration::from_secs(window_secs),
            capacity,
        })
    }

    #[test]
    fn a_deletion_is_taken_once_when_its_key_moves_here() {
        let t0 = Instant::now();
        let mut m = memory(10, 8);
        m.deleted(1, "/ConfigMap/ns/a", t0);
        m.deleted(2, "/ConfigMap/ns/b", t0);
        assert_eq!(
            m.keys_where(t0, |h, _| h == 2),
            vec![Arc::<str>::from("/ConfigMap/ns/b")]
        );
        let taken = m.take_where(t0 + Duration::from_secs(1), |h, _| h == 1);
        assert_eq!(taken, vec![Arc::<str>::from("/ConfigMap/ns/a")]);
        assert!(
            m.take_where(t0 + Duration::from_secs(1), |h, _| h == 1)
                .is_empty()
        );
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn a_recreated_key_is_forgotten() {
        let t0 = Instant::now();
        let mut m = memory(10, 8);
        m.deleted(1, "/ConfigMap/ns/a", t0);
        m.exists(1);
        assert!(m.take_where(t0, |_, _| true).is_empty());
    }

    #[test]
    fn deletions_older_than_the_window_are_forgotten() {
        let t0 = Instant::now();
        let mut m = memory(10, 8);
        m.deleted(1, "/ConfigMap/ns/a", t0);
        m.deleted(2, "/ConfigMap/ns/b", t0 + Duration::from_secs(5));
        let taken = m.take_where(t0 + Duration::from_secs(12), |_, _| true);
        assert_eq!(taken, vec![Arc::<str>::from("/ConfigMap/ns/b")]);
    }

    #[test]
    fn a_full_memory_makes_room_from_expired_deletions_then_counts_overflow() {
        let t0 = Instant::now();
        let mut m = memory(10, 2);
        assert!(m.deleted(1, "a", t0));
        assert!(m.deleted(2, "b", t0 + Duration::from_secs(6)));
        // Full, but "a" is past the window at t0 + 11 s: it makes room.
        assert!(m.deleted(3, "c", t0 + Duration::from_secs(11)));
        assert_eq!(m.len(), 2);
        // Full of deletions within the window: not remembered, counted.
        assert!(!m.deleted(4, "d", t0 + Duration::from_secs(12)));
        assert_eq!(m.overflowed(), 1);
        // Deleting a remembered key again needs no room.
        assert!(m.deleted(3, "c", t0 + Duration::from_secs(12)));
    }

    #[test]
    fn a_zero_capacity_remembers_nothing() {
        let t0 = Instant::now();
        let mut m = RecentDeletions::new(RecentDeletionsConfig::NONE);
        assert!(m.deleted(1, "a", t0));
        assert!(m.is_empty());
        assert_eq!(m.overflowed(), 0);
    }
}
