use super::*;

/// A loss report shows what happened to the key, oldest first: here the last reconcile saw
/// the object deleted before it was written again and deleted again.
#[tokio::test(start_paused = true)]
async fn the_history_of_a_key_lists_writes_deletions_and_reconciles_in_order() {
    let origin = Instant::now();
    let journal = Journal::default();
    let step = || tokio::time::advance(Duration::from_millis(500));
    journal.wrote("ns/a".into(), 10);
    step().await;
    let first = journal.begin("ns/a".into(), 10, "r0");
    journal.end(first);
    step().await;
    journal.deleted("ns/a".into());
    journal.wrote("ns/b".into(), 11);
    step().await;
    let gone = journal.begin_with("ns/a".into(), 10, true, "r1");
    journal.end(gone);
    step().await;
    journal.wrote("ns/a".into(), 12);
    step().await;
    journal.deleted("ns/a".into());
    assert_eq!(
        journal.history("ns/a", origin, 8),
        "0.00s w10, 0.50s r10 by r0 to 0.50s, 1.00s del, 1.50s r-del by r1 to 1.50s, 2.00s w12, 2.50s del"
    );
    assert_eq!(journal.history("ns/a", origin, 2), "2.00s w12, 2.50s del");
    // Its last reconcile saw it gone, and none saw the re-creation: the controllers' last
    // view is its final state.
    assert!(journal.last_view_is_deleted("ns/a"));
    // Had a reconcile seen the re-creation, the deletion after it would be a loss.
    step().await;
    let seen = journal.begin("ns/a".into(), 12, "r0");
    journal.end(seen);
    assert!(!journal.last_view_is_deleted("ns/a"));
    assert!(!journal.last_view_is_deleted("ns/b"), "never reconciled");
}
