//! The bytes of object bodies every group of a process may hold between them.
//!
//! Each group keeps bodies within its own budget ([`super::QueueConfig::body_budget`]); the
//! pool bounds their sum, so a process holds at most its capacity in bodies however many groups
//! and identities it serves. A body that does not fit is not kept: its key is delivered without
//! body and the controller reads the object fresh. The pool is shared fairly by
//! [`super::GroupQueue::hold_bodies_to`]: once it runs short, the groups holding more than an even
//! share give bodies back (see the dispatcher's housekeeping).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

/// The pools a group's queue takes from: bodies, and apart from them memos
/// ([`super::GroupQueue::leave_memo`]), so memos never crowd bodies out.
#[derive(Clone, Debug)]
pub struct Pools {
    /// Object bodies of queued keys (`--max-body-bytes`).
    pub bodies: BodyPool,
    /// Memos acknowledgements left (`--max-memo-bytes`).
    pub memos: BodyPool,
}

impl Pools {
    /// Pools that bound nothing (each group's own budgets still do).
    pub fn unbounded() -> Self {
        Self {
            bodies: BodyPool::unbounded(),
            memos: BodyPool::unbounded(),
        }
    }
}

/// A shared count of body bytes against a capacity. Cheap to clone: clones share the count.
#[derive(Clone, Debug)]
pub struct BodyPool(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    capacity: usize,
    used: AtomicUsize,
    /// Of `used`, the bytes held outside the groups' queues ([`HeldBody`]).
    held: AtomicUsize,
}

impl BodyPool {
    /// A pool of `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Self(Arc::new(Inner {
            capacity,
            used: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
        }))
    }

    /// A pool that bounds nothing (each group's own budget still does).
    pub fn unbounded() -> Self {
        Self::new(usize::MAX)
    }

    /// Its capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.0.capacity
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.0.used.load(Ordering::Relaxed)
    }

    /// Whether less than a tenth of the capacity is left: time to share it out again.
    pub fn is_short(&self) -> bool {
        self.capacity() - self.used().min(self.capacity()) < self.capacity() / 10
    }

    /// Takes `bytes` if they fit; false (and nothing taken) if not.
    pub(crate) fn take(&self, bytes: usize) -> bool {
        self.take_within(bytes, self.0.capacity)
    }

    /// Takes `bytes` if the pool holds at most `limit` with them; false (and nothing taken)
    /// if not.
    fn take_within(&self, bytes: usize, limit: usize) -> bool {
        self.0
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .is_ok()
    }

    /// Gives back `bytes` taken before.
    pub(crate) fn give_back(&self, bytes: usize) {
        self.0.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// The bytes the groups share between them: the capacity less what is held outside their
    /// queues ([`HeldBody`], at most half of it), so that what each group is given as its share
    /// is there to take.
    pub fn shared_capacity(&self) -> usize {
        self.capacity()
            .saturating_sub(self.0.held.load(Ordering::Acquire))
    }

    /// The bytes held outside the groups' queues ([`HeldBody`]).
    pub fn held(&self) -> usize {
        self.0.held.load(Ordering::Acquire)
    }
}

/// A body kept outside the groups' queues (an owner's child, [`crate::children`]), taken from
/// a pool only while the pool stays at most half full: such bodies take at most half of it,
/// and the groups share what they leave ([`BodyPool::shared_capacity`]). Given back when
/// dropped.
#[derive(Debug)]
pub struct HeldBody {
    body: Arc<[u8]>,
    pool: BodyPool,
}

impl HeldBody {
    /// Holds `body` in `pool` if the pool stays at most half full with it; `None` if not.
    pub fn take(pool: &BodyPool, body: Arc<[u8]>) -> Option<Self> {
        let bytes = body.len();
        if !pool.take_within(bytes, pool.capacity() / 2) {
            return None;
        }
        pool.0.held.fetch_add(bytes, Ordering::AcqRel);
        Some(Self {
            body,
            pool: pool.clone(),
        })
    }

    /// The body.
    pub fn body(&self) -> &Arc<[u8]> {
        &self.body
    }
}

impl Drop for HeldBody {
    fn drop(&mut self) {
        self.pool
            .0
            .held
            .fetch_sub(self.body.len(), Ordering::AcqRel);
        self.pool.give_back(self.body.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_only_what_fits_and_clones_share_the_count() {
        let pool = BodyPool::new(100);
        let other = pool.clone();
        assert!(pool.take(60));
        assert!(!other.take(41), "60 + 41 > 100");
        assert!(other.take(40));
        assert_eq!(pool.used(), 100);
        assert!(pool.is_short());
        pool.give_back(60);
        assert_eq!(other.used(), 40);
        assert!(!pool.is_short());
        assert!(BodyPool::unbounded().take(usize::MAX));
    }

    #[test]
    fn held_bodies_take_at_most_half_the_pool_and_give_it_back_when_dropped() {
        let pool = BodyPool::new(100);
        let body = |n: usize| -> Arc<[u8]> { vec![0; n].into() };
        let first = HeldBody::take(&pool, body(30)).expect("30 of 100 fits in the half");
        assert!(HeldBody::take(&pool, body(21)).is_none(), "30 + 21 > 50");
        let second = HeldBody::take(&pool, body(20)).expect("30 + 20 = 50");
        assert_eq!(pool.used(), 50);
        assert_eq!(
            (pool.held(), pool.shared_capacity()),
            (50, 50),
            "the groups share the half left"
        );
        drop(first);
        assert_eq!(pool.used(), 20);
        assert_eq!((pool.held(), pool.shared_capacity()), (20, 80));
        assert!(pool.take(40), "the groups' bodies still have the rest");
        assert!(
            HeldBody::take(&pool, body(1)).is_none(),
            "past half full, no more"
        );
        drop(second);
        assert_eq!(pool.used(), 40);
    }
}
