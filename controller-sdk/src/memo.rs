//! A reconcile's note to the next reconcile of the same object, kept by the dispatcher.
//!
//! A controller with no cache cannot remember what it wrote last time, so it reads it again.
//! The memo is where it can: a few hundred bytes ([`MAX_MEMO_BYTES`]) the acknowledgement
//! carries to the dispatcher, handed back with the key's next delivery. Its first use is
//! [`crate::children::Checked`]: the versions of the children a reconcile wrote or read, so the
//! next one reads only a child that changed since.
//!
//! A memo is a hint. A delivery may come without it (the key moved to another dispatcher, the
//! dispatcher restarted or its memo budget was full, the object was made again under the same
//! name) and a reconcile must then do what it would have skipped. Keep in it only what stays
//! true once written, such as "version R of child X holds what I wrote", and check it against
//! the request.
//!
//! ```no_run
//! use kube_dispatch_controller::memo;
//!
//! # async fn reconcile() -> Result<(), memo::MemoError> {
//! // Inside a reconcile: what the last one left, if anything.
//! let last: Option<Vec<u8>> = memo::previous();
//! // ...the work...
//! memo::leave(b"what the next reconcile should know".to_vec())?;
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Mutex};

pub use kube_dispatch_proto::MAX_MEMO_BYTES;

tokio::task_local! {
    /// The memo of the reconcile this task runs: the request's, until the reconcile leaves one.
    static MEMO: Slot;
}

/// A memo the dispatcher would refuse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MemoError {
    /// Longer than the dispatcher keeps.
    #[error("a memo of {len} bytes is longer than the {MAX_MEMO_BYTES} a dispatcher keeps")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Called outside a reconcile (or in a task the reconcile spawned).
    #[error("no reconcile runs in this task: a memo is left from the reconcile's own task")]
    OutsideReconcile,
}

/// The memo of one delivery: what its request carried, replaced by what the reconcile leaves.
#[derive(Clone, Debug)]
pub(crate) struct Slot(Arc<Mutex<Vec<u8>>>);

impl Slot {
    /// A slot holding the request's memo.
    pub(crate) fn new(memo: Vec<u8>) -> Self {
        Self(Arc::new(Mutex::new(memo)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What to acknowledge with: the memo left, or the request's if none was (empty: none).
    pub(crate) fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.lock())
    }

    /// Runs `reconcile` with this slot as its memo.
    pub(crate) async fn scope<F: Future>(&self, reconcile: F) -> F::Output {
        MEMO.scope(self.clone(), reconcile).await
    }
}

/// The memo the last acknowledged reconcile of this object left, as this dispatcher kept it;
/// `None` if there is none (or outside a reconcile). Once the reconcile leaves a memo, the one
/// it left.
pub fn previous() -> Option<Vec<u8>> {
    MEMO.try_with(|slot| slot.lock().clone())
        .ok()
        .filter(|m| !m.is_empty())
}

/// Leaves `memo` for the next reconcile of this object, in place of the one it was given; empty
/// leaves none. Sent with this reconcile's acknowledgement, whatever its outcome (what a failed
/// reconcile wrote stays written).
pub fn leave(memo: Vec<u8>) -> Result<(), MemoError> {
    if memo.len() > MAX_MEMO_BYTES {
        return Err(MemoError::TooLong { len: memo.len() });
    }
    MEMO.try_with(|slot| *slot.lock() = memo)
        .map_err(|_| MemoError::OutsideReconcile)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reconcile_reads_the_memo_it_was_given_and_leaves_another() {
        let slot = Slot::new(b"before".to_vec());
        let seen = slot
            .scope(async {
                let seen = previous();
                leave(b"after".to_vec()).expect("within the bound");
                (seen, previous())
            })
            .await;
        assert_eq!(seen, (Some(b"before".to_vec()), Some(b"after".to_vec())));
        assert_eq!(slot.take(), b"after");
        assert_eq!(previous(), None, "nothing outside a reconcile");
        assert_eq!(leave(Vec::new()), Err(MemoError::OutsideReconcile));
    }

    #[tokio::test]
    async fn a_memo_past_the_bound_is_refused_and_the_given_one_kept() {
        let slot = Slot::new(b"given".to_vec());
        let refused = slot
            .scope(async { leave(vec![0; MAX_MEMO_BYTES + 1]) })
            .await;
        assert_eq!(
            refused,
            Err(MemoError::TooLong {
                len: MAX_MEMO_BYTES + 1
            })
        );
        assert_eq!(
            slot.take(),
            b"given",
            "an untouched memo is carried forward"
        );
    }
}
