package engine

import (
	"context"
	"testing"
	"time"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// A poll asks beyond the free workers only once a window (twice the workers) of reconciles has
// ended, each within an eighth of the limit; a slow one stops it until a full window of quick
// ones follows the window it ended in.
func TestPollsAskAheadOnlyWhileReconcilesAreQuick(t *testing.T) {
	const limit = time.Minute
	q := NewQueue(1, NewMetrics("test", "prefetch"))
	s := testSession()
	accept := func(id uint64, name string) {
		q.Accept(s, []*pb.ReconcileRequest{request(id, name)}, time.Now().Add(limit), limit)
	}
	// finish runs the next delivery as a reconcile that took took.
	finish := func(took time.Duration) {
		item, _ := q.Get()
		q.mu.Lock()
		q.taken[item.NamespacedName].started = time.Now().Add(-took)
		q.mu.Unlock()
		q.Done(item)
	}
	reconcile := func(id uint64, name string, took time.Duration) {
		accept(id, name)
		finish(took)
	}
	asks := func(want int, when string) {
		t.Helper()
		if got := q.free(limit); got != want {
			t.Fatalf("%s: a poll asks for %d, want %d", when, got, want)
		}
	}
	asks(1, "before any reconcile")
	reconcile(1, "a", time.Millisecond)
	asks(1, "after half a window")
	reconcile(2, "b", time.Millisecond)
	asks(2, "after a quick window")
	// One delivery waiting for the worker: one more may still be asked for.
	accept(3, "c")
	asks(1, "with one taken")
	finish(limit/8 + time.Millisecond)
	asks(1, "after a slow reconcile")
	reconcile(4, "d", time.Millisecond)
	asks(1, "its window just ended")
	reconcile(5, "e", time.Millisecond)
	reconcile(6, "f", time.Millisecond)
	asks(2, "a quick window since")
	q.Prefetch(0)
	reconcile(7, "g", time.Millisecond)
	reconcile(8, "h", time.Millisecond)
	asks(1, "turned off")
}

// What counts as quick is shared by the sessions polling at once; a delivery whose deadline
// passed counts as slow, whether it waited for a worker or ran, however short its run.
func TestAskingAheadWeighsTheSessionsAndTheDeadlines(t *testing.T) {
	const limit = time.Minute
	q := NewQueue(1, NewMetrics("test", "prefetch-sessions"))
	s := testSession()
	asks := func(want int, when string) {
		t.Helper()
		if got := q.free(limit); got != want {
			t.Fatalf("%s: a poll asks for %d, want %d", when, got, want)
		}
	}
	// quickWindow runs a window of reconciles that took took, each by a deadline of limit.
	id := uint64(0)
	quickWindow := func(took time.Duration) {
		for range 2 {
			id++
			q.Accept(s, []*pb.ReconcileRequest{request(id, "w")}, time.Now().Add(limit), limit)
			item, _ := q.Get()
			q.mu.Lock()
			q.taken[item.NamespacedName].started = time.Now().Add(-took)
			q.mu.Unlock()
			q.Done(item)
		}
	}
	first := q.serving()
	quickWindow(limit / 20)
	asks(2, "one session, a twentieth of the limit")
	second := q.serving()
	asks(2, "two sessions, within an eighth of the limit over two")
	third := q.serving()
	asks(1, "three sessions: too slow to ask ahead")
	third()
	second()
	quickWindow(time.Millisecond)
	asks(2, "one session again, a quick window")

	// A delivery whose deadline passed while it ran, after a run of a millisecond (a long
	// wait for a worker before it).
	id++
	q.Accept(s, []*pb.ReconcileRequest{request(id, "late")}, time.Now().Add(limit), limit)
	item, _ := q.Get()
	passed, cancel := context.WithDeadline(context.Background(), time.Now())
	defer cancel()
	q.mu.Lock()
	d := q.taken[item.NamespacedName]
	d.Ctx, d.started = passed, time.Now().Add(-time.Millisecond)
	q.mu.Unlock()
	q.Done(item)
	asks(1, "after a reconcile past its deadline")
	quickWindow(time.Millisecond)
	quickWindow(time.Millisecond)
	asks(2, "two quick windows since")

	// A delivery whose deadline passed while it waited: never handed out, counted as slow.
	id++
	q.Accept(s, []*pb.ReconcileRequest{request(id, "waited")}, time.Now(), limit)
	id++
	q.Accept(s, []*pb.ReconcileRequest{request(id, "next")}, time.Now().Add(limit), limit)
	if item, _ := q.Get(); item.Name != "next" {
		t.Fatalf("handed out %v, want the delivery still within its deadline", item)
	}
	asks(0, "after a delivery timed out waiting, with one running")
	first()
}
