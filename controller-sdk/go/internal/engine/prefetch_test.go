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
	reconcile := func(id uint64, name string, took time.Duration) {
		t.Helper()
		q.Accept(s, []*pb.ReconcileRequest{request(id, name)}, time.Now().Add(limit), limit)
		item, _ := q.Get()
		q.mu.Lock()
		q.taken[item.NamespacedName].started = time.Now().Add(-took)
		q.mu.Unlock()
		q.Done(item)
	}
	if got := q.free(limit); got != 1 {
		t.Fatalf("before any reconcile: %d", got)
	}
	reconcile(1, "a", time.Millisecond)
	if got := q.free(limit); got != 1 {
		t.Fatalf("after half a window: %d", got)
	}
	reconcile(2, "b", time.Millisecond)
	if got := q.free(limit); got != 2 {
		t.Fatalf("after a quick window: %d", got)
	}
	// One delivery waiting for the worker: one more may still be asked for.
	q.Accept(s, []*pb.ReconcileRequest{request(3, "c")}, time.Now().Add(limit), limit)
	if got := q.free(limit); got != 1 {
		t.Fatalf("with one taken: %d", got)
	}
	item, _ := q.Get()
	q.mu.Lock()
	q.taken[item.NamespacedName].started = time.Now().Add(-limit/8 - time.Millisecond)
	q.mu.Unlock()
	q.Done(item)
	if got := q.free(limit); got != 1 {
		t.Fatalf("after a slow reconcile: %d", got)
	}
	reconcile(4, "d", time.Millisecond)
	if got := q.free(limit); got != 1 {
		t.Fatalf("its window just ended: %d", got)
	}
	reconcile(5, "e", time.Millisecond)
	reconcile(6, "f", time.Millisecond)
	if got := q.free(limit); got != 2 {
		t.Fatalf("a quick window since: %d", got)
	}
	q.Prefetch(0)
	reconcile(7, "g", time.Millisecond)
	reconcile(8, "h", time.Millisecond)
	if got := q.free(limit); got != 1 {
		t.Fatalf("turned off: %d", got)
	}
}
