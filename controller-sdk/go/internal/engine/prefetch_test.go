package engine

import (
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
