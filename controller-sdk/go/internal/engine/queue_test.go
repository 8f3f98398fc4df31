package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

func testSession() *Session { return DetachedSession("") }

func farDeadline() time.Time { return time.Now().Add(time.Minute) }

func request(id uint64, name string) *pb.ReconcileRequest {
	return &pb.ReconcileRequest{
		DeliveryId: id,
		Key:        "/ConfigMap/ns/" + name,
		Object:     &pb.ObjectKey{Version: "v1", Kind: "ConfigMap", Namespace: "ns", Name: name},
		Memo:       []byte("m-" + name),
	}
}

func TestQueueAcksWhatTheReconcileReturned(t *testing.T) {
	q := NewQueue(2, NewMetrics("test", "test"))
	s := testSession()
	q.Accept(s, []*pb.ReconcileRequest{request(1, "a"), request(2, "a"), request(3, "b")}, time.Now().Add(time.Minute), time.Minute)
	// The second delivery of a key a worker here still holds goes back at once, failed.
	if len(s.pending) != 1 || s.pending[0].GetDeliveryId() != 2 || s.pending[0].GetFailure() == nil {
		t.Fatalf("pending acks: %v", s.pending)
	}
	if q.free(time.Minute) != 0 {
		t.Fatalf("free slots: %d", q.free(time.Minute))
	}
	item, shutdown := q.Get()
	if shutdown || item.Name != "a" {
		t.Fatalf("got %v, %v", item, shutdown)
	}
	d := q.Delivery(item.NamespacedName)
	d.Outcome = AckFor(reconcile.Result{RequeueAfter: 3 * time.Second}, nil)
	d.memo = []byte("left")
	q.Done(item)
	ack := s.pending[1]
	if ack.GetDeliveryId() != 1 || ack.GetRequeue().GetAfter().AsDuration() != 3*time.Second || string(ack.GetMemo()) != "left" {
		t.Fatalf("ack: %v", ack)
	}
	if _, outstanding := s.state(); outstanding != 1 {
		t.Fatalf("outstanding: %d", outstanding)
	}
	// A reconcile that never returned a result (a panic) fails.
	item, _ = q.Get()
	q.Done(item)
	if ack := s.pending[2]; ack.GetDeliveryId() != 3 || ack.GetFailure() == nil || string(ack.GetMemo()) != "m-b" {
		t.Fatalf("ack: %v", ack)
	}
}

func TestALostSessionsDeliveriesAreCancelledAndNeverAcked(t *testing.T) {
	q := NewQueue(2, NewMetrics("test", "test"))
	s := testSession()
	q.Accept(s, []*pb.ReconcileRequest{request(1, "a"), request(2, "b")}, time.Now().Add(time.Minute), time.Minute)
	item, _ := q.Get()
	d := q.Delivery(item.NamespacedName)
	s.cancel(ErrFenced)
	select {
	case <-d.Ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the running reconcile's context did not end with its session")
	}
	if !errors.Is(context.Cause(d.Ctx), ErrFenced) {
		t.Fatalf("the running reconcile's context: %v", context.Cause(d.Ctx))
	}
	q.dropSession(s, false)
	if q.Len() != 0 {
		t.Fatal("the waiting delivery of the lost session was kept")
	}
	d.Outcome = AckFor(reconcile.Result{}, nil)
	q.Done(item)
	if len(s.pending) != 0 {
		t.Fatalf("a fenced reconcile was acknowledged: %v", s.pending)
	}
	if _, outstanding := s.state(); outstanding != 0 {
		t.Fatalf("outstanding: %d", outstanding)
	}
}

func TestADeliveryPastItsDeadlineIsNotHandedOut(t *testing.T) {
	q := NewQueue(1, NewMetrics("test", "test"))
	s := testSession()
	q.Accept(s, []*pb.ReconcileRequest{request(1, "a")}, time.Now().Add(-time.Millisecond), time.Minute)
	q.Accept(s, []*pb.ReconcileRequest{request(2, "b")}, time.Now().Add(time.Minute), time.Minute)
	item, _ := q.Get()
	if item.NamespacedName != (types.NamespacedName{Namespace: "ns", Name: "b"}) {
		t.Fatalf("got %v", item)
	}
	if len(s.pending) != 1 || s.pending[0].GetDeliveryId() != 1 || s.pending[0].GetFailure() == nil {
		t.Fatalf("pending: %v", s.pending)
	}
	q.ShutDown()
	if _, shutdown := q.Get(); !shutdown {
		t.Fatal("Get after ShutDown")
	}
}

func TestAcksFromResultsAndErrors(t *testing.T) {
	cases := []struct {
		name   string
		result reconcile.Result
		err    error
		check  func(*pb.AckItem) bool
	}{
		{"success", reconcile.Result{}, nil, func(a *pb.AckItem) bool { return a.GetSuccess() != nil }},
		{"error", reconcile.Result{}, errors.New("boom"), func(a *pb.AckItem) bool { return a.GetFailure().GetMessage() == "boom" }},
		{"terminal error", reconcile.Result{}, reconcile.TerminalError(errors.New("bad spec")), func(a *pb.AckItem) bool { return a.GetSuccess() != nil }},
		{"requeue after", reconcile.Result{RequeueAfter: time.Minute}, nil, func(a *pb.AckItem) bool { return a.GetRequeue().GetAfter().AsDuration() == time.Minute }},
		{"requeue after, capped", reconcile.Result{RequeueAfter: 30 * 24 * time.Hour}, nil, func(a *pb.AckItem) bool { return a.GetRequeue().GetAfter().AsDuration() == maxRequeue }},
		//lint:ignore SA1019 Requeue is deprecated but still honoured.
		{"requeue", reconcile.Result{Requeue: true}, nil, func(a *pb.AckItem) bool { return a.GetFailure() != nil }},
	}
	for _, c := range cases {
		if got := AckFor(c.result, c.err); !c.check(got) {
			t.Errorf("%s: %v", c.name, got)
		}
	}
}

func TestReconnectsStartAgainAfterASessionThatWorked(t *testing.T) {
	var r Reconnects
	var last time.Duration
	for range 12 {
		last = r.Next(false)
	}
	if last < 30*time.Second || last > time.Minute {
		t.Fatalf("after 12 failures: %v", last)
	}
	if after := r.Next(true); after > 200*time.Millisecond {
		t.Fatalf("after a session that worked: %v", after)
	}
}

// The queue keeps controller-runtime's workqueue gauges as its own queue would: depth counts
// what waits for a worker (a dropped session's deliveries leave it), and the unfinished work
// is the running reconciles' time so far, zero again once they are done.
func TestQueueGaugesFollowTheDeliveries(t *testing.T) {
	m := NewMetrics("test", "gauges")
	// The series outlive the test (the process's registry): count from where they stand.
	m.queue.depth.Set(0)
	q := NewQueue(3, m)
	s, lost := testSession(), testSession()
	q.Accept(s, []*pb.ReconcileRequest{request(1, "a"), request(2, "b")}, farDeadline(), time.Minute)
	q.Accept(lost, []*pb.ReconcileRequest{request(3, "c")}, farDeadline(), time.Minute)
	if got := testutil.ToFloat64(m.queue.depth); got != 3 {
		t.Fatalf("depth after three deliveries: %v", got)
	}
	q.dropSession(lost, false)
	item, _ := q.Get()
	if got := testutil.ToFloat64(m.queue.depth); got != 1 {
		t.Fatalf("depth after a dropped session and a Get: %v", got)
	}
	q.Delivery(item.NamespacedName).started = time.Now().Add(-time.Second)
	q.UpdateUnfinished()
	if got := testutil.ToFloat64(m.queue.longestRunning); got < 1 {
		t.Fatalf("longest running reconcile: %v s, want at least 1", got)
	}
	q.Done(item)
	q.UpdateUnfinished()
	if got := testutil.ToFloat64(m.queue.unfinished); got != 0 {
		t.Fatalf("unfinished work once the reconcile was done: %v", got)
	}
}

// Stopping: waiting deliveries stay for the drain to hand back, and new ones are handed back
// at once, not failed.
func TestAStoppingQueueHandsWorkBack(t *testing.T) {
	q := NewQueue(2, NewMetrics("test", "test"))
	s := testSession()
	q.Accept(s, []*pb.ReconcileRequest{request(1, "a")}, farDeadline(), 0)
	q.ShutDown()
	if _, shutdown := q.Get(); !shutdown {
		t.Fatal("Get handed out work after ShutDown")
	}
	q.Accept(s, []*pb.ReconcileRequest{request(2, "b")}, farDeadline(), 0)
	if len(s.pending) != 1 || s.pending[0].GetRequeue() == nil {
		t.Fatalf("pending: %v", s.pending)
	}
	q.dropSession(s, true)
	if len(s.pending) != 2 || s.pending[1].GetDeliveryId() != 1 || s.pending[1].GetRequeue() == nil {
		t.Fatalf("pending: %v", s.pending)
	}
}

func TestFailureMessagesAreValidUTF8WithinTheBound(t *testing.T) {
	long := strings.Repeat("é", maxFailureMessage) // two bytes each: a cut at the bound splits one
	for _, text := range []string{"bad \xff byte", long} {
		m := failureMessage(errors.New(text))
		if !utf8.ValidString(m) || len(m) > maxFailureMessage {
			t.Fatalf("%d bytes, valid %v", len(m), utf8.ValidString(m))
		}
	}
}
