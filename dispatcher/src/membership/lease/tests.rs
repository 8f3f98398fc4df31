use std::{collections::BTreeMap, time::Duration};

use super::*;

/// A renewal accepted after the Lease ran out marks the slice changed (a poll waiting on it
/// is answered: the keys are handed out again); one accepted in time publishes nothing.
#[test]
fn a_renewal_after_the_lease_ran_out_wakes_the_slices_waiters() {
    let t0 = Instant::now();
    let mut handover = Handover::new("d0", Duration::from_secs(10), t0, false);
    let slice = handover.update(&BTreeMap::new(), 0, false, t0);
    let (tx, mut rx) = watch::channel(Arc::new(slice));
    rx.mark_unchanged();
    let lease = Duration::from_secs(4);
    // The first renewal: the Lease was never current.
    renewal_accepted(&handover, &tx, t0 + lease, || t0);
    assert!(rx.has_changed().unwrap_or(false), "the first renewal wakes");
    rx.mark_unchanged();
    // Renewed in time: nothing to tell.
    renewal_accepted(&handover, &tx, t0 + 2 * lease, || t0 + lease / 2);
    assert!(
        !rx.has_changed().unwrap_or(true),
        "a renewal in time publishes nothing"
    );
    // The answer comes after the deadline (t0 + 2 × lease) had passed.
    renewal_accepted(&handover, &tx, t0 + 4 * lease, || t0 + 3 * lease);
    assert!(
        rx.has_changed().unwrap_or(false),
        "a late renewal wakes the waiters"
    );
}
