package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// maxRequeue is the longest requeue the dispatcher takes; a longer one is sent as this.
const maxRequeue = 7 * 24 * time.Hour

// maxFailureMessage bounds the error text an ack carries back to the dispatcher's logs.
const maxFailureMessage = 1024

// Delivery is one reconcile request handed to this replica by one session, from its arrival
// until its worker is done with it.
type Delivery struct {
	Request *pb.ReconcileRequest
	Name    types.NamespacedName
	Session *Session
	Metrics *Metrics
	// Ctx ends at the delivery's deadline, or when its session is lost (then cause is
	// errFenced): the reconcile must stop.
	Ctx    context.Context
	cancel context.CancelFunc
	// Limit is how long the reconcile may take from its delivery (for the timeout's message).
	Limit time.Duration
	// arrived and started are when the delivery came and when a worker took it.
	arrived, started time.Time

	// Set by the reconciler wrapper as the reconcile returns; nil when it never returned (a
	// panic, recovered by controller-runtime).
	Outcome *pb.AckItem
	// handedOut is set once a worker has it (Get), under the queue's lock.
	handedOut bool

	// mu guards memo and served, which the reconcile sets.
	mu sync.Mutex
	// memo is what the reconcile left for the next delivery of the object (LeaveMemo); the
	// delivered memo when it left none.
	memo []byte
	// served is set once NewClient's client has served the delivered object to the reconcile:
	// later reads of it go to the API server, or to written.
	served bool
	// written is the delivered object as the API server answered the reconcile's last write of
	// it, as JSON, and the Go type it was decoded into (Wrote).
	written     []byte
	writtenType string
}

// NewDelivery is a delivery of request that belongs to no session or queue: what a reconcile
// reads of its delivery (Memo, the object), for tests of the reconcile's side alone.
func NewDelivery(request *pb.ReconcileRequest, metrics *Metrics) *Delivery {
	return &Delivery{
		Request: request,
		Name:    types.NamespacedName{Namespace: request.GetObject().GetNamespace(), Name: request.GetObject().GetName()},
		Metrics: metrics,
		memo:    request.GetMemo(),
	}
}

// Memo is what the reconcile left for the next delivery of the object, else the delivered
// memo.
func (d *Delivery) Memo() []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.memo
}

// LeaveMemo sets the memo the delivery's ack carries (a copy of memo).
func (d *Delivery) LeaveMemo(memo []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.memo = append([]byte(nil), memo...)
}

// Serve says whether the delivered object is still to be served to the reconcile (true once:
// later reads, after its own writes, go to the API server).
func (d *Delivery) Serve() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	first := !d.served
	d.served = true
	return first
}

// Wrote records the delivered object as the API server answered the reconcile's write of it
// (its JSON, decoded into goType): a later read of it into that type is served this, the
// reconcile's own write, without a request.
func (d *Delivery) Wrote(goType string, body []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.written, d.writtenType = body, goType
}

// Written is the delivered object as the reconcile's last write of it left it, if it was
// decoded into goType.
func (d *Delivery) Written(goType string) ([]byte, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.written, d.written != nil && d.writtenType == goType
}

// ErrFenced is the cause of a delivery's context when its session was lost: its key may go to
// another replica, so the reconcile must stop and is not acknowledged.
var ErrFenced = errors.New("kube-dispatch: the session that delivered this request was lost; its key may be reconciled elsewhere")

// Queue is the controller's work queue, fed by the dispatchers instead of informers: Get is a
// delivery from a session, Done acknowledges it with the outcome the reconcile returned. The
// dispatcher, not this queue, owns retries, backoff, coalescing and per-key exclusivity, so the
// queue ignores the controller's own Add, AddAfter, AddRateLimited and Forget: a failed or
// requeued reconcile is reported in its ack, and the dispatcher delivers the key again.
//
// Bound: at most slots plus the prefetch deliveries per open session (each poll asks for the
// free slots and, while reconciles are quick, up to the prefetch more, and sessions poll
// concurrently), so at most that many × assigned dispatchers.
type Queue struct {
	mu   sync.Mutex
	cond *sync.Cond
	// slots is the controller's MaxConcurrentReconciles.
	slots int
	// ready waits for a worker, in order of arrival.
	ready []*Delivery
	// taken holds every delivery accepted and not done yet (ready or with a worker), by name:
	// one at a time per object in this replica.
	taken map[types.NamespacedName]*Delivery
	// freed is signalled (without blocking) whenever a slot frees up.
	freed chan struct{}
	// pace is how many deliveries polls ask for beyond the free slots.
	pace pace
	// sessions is how many sessions poll (serving).
	sessions int

	shuttingDown bool
	metrics      *Metrics
}

var _ workqueue.TypedRateLimitingInterface[reconcile.Request] = (*Queue)(nil)

func NewQueue(slots int, metrics *Metrics) *Queue {
	q := &Queue{
		slots:   slots,
		taken:   make(map[types.NamespacedName]*Delivery),
		freed:   make(chan struct{}, 1),
		pace:    newPace(slots, slots),
		metrics: metrics,
	}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Prefetch sets the most deliveries a poll asks for beyond the free slots while reconciles
// are quick (see pace; default: the slots; 0: none).
func (q *Queue) Prefetch(most int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pace = newPace(most, q.slots)
}

// free is the number of deliveries a poll may ask for now, reconciles being allowed limit
// each: the free slots, and while reconciles are quick the prefetch, less what already waits.
func (q *Queue) free(limit time.Duration) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return max(q.slots+q.pace.ahead(limit, q.sessions)-len(q.taken), 0)
}

// serving counts a session that polls until the function it returns is called.
func (q *Queue) serving() (done func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sessions++
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.sessions--
	}
}

// Accept takes the requests a poll of s answered, each to be reconciled by deadline (limit
// after its delivery, see fence.Fence.Renew). A request for an object a worker of this replica still
// has (a key handed over between dispatchers while it ran) is acknowledged as failed at once,
// and the dispatcher delivers it again later.
func (q *Queue) Accept(s *Session, requests []*pb.ReconcileRequest, deadline time.Time, limit time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range requests {
		q.metrics.delivered(r.GetReason())
		name := types.NamespacedName{Namespace: r.GetObject().GetNamespace(), Name: r.GetObject().GetName()}
		if q.shuttingDown {
			s.ack(notRunHere(r))
			continue
		}
		if _, busy := q.taken[name]; busy {
			s.ack(&pb.AckItem{
				DeliveryId: r.GetDeliveryId(),
				Outcome:    &pb.AckItem_Failure{Failure: &pb.Failure{Message: "already reconciling this object in this replica"}},
				Memo:       r.GetMemo(),
			})
			continue
		}
		// A child of the session's context: it ends at once when the session is lost (its
		// cause then errFenced), and at the deadline (context.DeadlineExceeded).
		ctx, cancel := context.WithDeadline(s.ctx, deadline)
		d := &Delivery{
			Request: r,
			Name:    name,
			Session: s,
			Metrics: q.metrics,
			Ctx:     ctx,
			cancel:  cancel,
			Limit:   limit,
			arrived: time.Now(),
			memo:    r.GetMemo(),
		}
		s.track(1)
		q.taken[name] = d
		q.ready = append(q.ready, d)
		q.metrics.queue.adds.Inc()
		q.metrics.queue.depth.Inc()
		if reason := r.GetReason(); reason == pb.Reason_REASON_RETRY || reason == pb.Reason_REASON_REQUEUE {
			q.metrics.queue.retries.Inc()
		}
	}
	q.cond.Broadcast()
}

// Get hands the next delivery to a worker; it blocks until one arrives or the queue shuts
// down. A delivery whose session was lost meanwhile is not handed out (finishLocked sends no
// ack for it: its key may be elsewhere now); one whose deadline passed while it waited is
// acknowledged as failed.
func (q *Queue) Get() (reconcile.Request, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		for len(q.ready) == 0 && !q.shuttingDown {
			q.cond.Wait()
		}
		// Shutting down: what still waits is handed back by the sessions' drain.
		if q.shuttingDown {
			return reconcile.Request{}, true
		}
		d := q.ready[0]
		q.ready[0] = nil
		q.ready = q.ready[1:]
		q.metrics.queue.depth.Dec()
		here := time.Since(d.arrived)
		q.metrics.queue.latency.Observe(here.Seconds())
		if waited := d.Request.GetWaited(); waited != nil {
			q.metrics.ready.Observe((waited.AsDuration() + here).Seconds())
		}
		if d.Ctx.Err() == nil {
			d.handedOut = true
			d.started = time.Now()
			return reconcile.Request{NamespacedName: d.Name}, false
		}
		if errors.Is(d.Ctx.Err(), context.DeadlineExceeded) {
			q.pace.reconciled(d.Limit)
		}
		q.finishLocked(d, &pb.AckItem{
			DeliveryId: d.Request.GetDeliveryId(),
			Outcome:    &pb.AckItem_Failure{Failure: &pb.Failure{Message: "timed out waiting for a worker"}},
		})
	}
}

// Done acknowledges the delivery of item with the outcome its reconcile returned.
func (q *Queue) Done(item reconcile.Request) {
	q.mu.Lock()
	defer q.mu.Unlock()
	d, ok := q.taken[item.NamespacedName]
	if !ok {
		return
	}
	outcome := d.Outcome
	if outcome == nil {
		outcome = &pb.AckItem{Outcome: &pb.AckItem_Failure{Failure: &pb.Failure{Message: "the reconcile returned no result (it panicked)"}}}
	}
	q.finishLocked(d, outcome)
}

// finishLocked frees d's slot and acknowledges it with outcome, unless its session was lost.
func (q *Queue) finishLocked(d *Delivery, outcome *pb.AckItem) {
	delete(q.taken, d.Name)
	if d.handedOut {
		took := time.Since(d.started)
		q.metrics.queue.work.Observe(took.Seconds())
		if errors.Is(d.Ctx.Err(), context.DeadlineExceeded) {
			// Its deadline passed: slow, however short the run after a long wait.
			took = d.Limit
		}
		q.pace.reconciled(took)
	}
	fenced := errors.Is(context.Cause(d.Session.ctx), ErrFenced)
	d.cancel()
	if fenced {
		q.metrics.fenced()
	} else {
		outcome.DeliveryId = d.Request.GetDeliveryId()
		d.mu.Lock()
		outcome.Memo = d.memo
		d.mu.Unlock()
		d.Session.ack(outcome)
	}
	d.Session.track(-1)
	select {
	case q.freed <- struct{}{}:
	default:
	}
	q.cond.Broadcast()
}

// Delivery is the delivery a worker is reconciling for name, if any.
func (q *Queue) Delivery(name types.NamespacedName) *Delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	if d := q.taken[name]; d != nil && d.handedOut {
		return d
	}
	return nil
}

// dropSession takes out the deliveries of s still waiting for a worker: s was lost (they are
// dropped unacknowledged: their keys may be elsewhere already) or closes (handBack: they are
// handed back, for the dispatcher to deliver at once to another replica).
func (q *Queue) dropSession(s *Session, handBack bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.ready[:0]
	for _, d := range q.ready {
		if d.Session != s {
			kept = append(kept, d)
			continue
		}
		delete(q.taken, d.Name)
		q.metrics.queue.depth.Dec()
		d.cancel()
		if handBack {
			s.ack(notRunHere(d.Request))
		}
		s.track(-1)
	}
	dropped := len(q.ready) - len(kept)
	clear(q.ready[len(kept):])
	q.ready = kept
	if dropped > 0 {
		// Slots the other sessions' polls count on are free again.
		select {
		case q.freed <- struct{}{}:
		default:
		}
	}
	q.cond.Broadcast()
}

// UpdateUnfinished sets the seconds the running reconciles have taken so far, in all and the
// longest, as controller-runtime's queue does every half second.
func (q *Queue) UpdateUnfinished() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	var total, longest float64
	for _, d := range q.taken {
		if d.handedOut {
			running := now.Sub(d.started).Seconds()
			total += running
			longest = max(longest, running)
		}
	}
	q.metrics.queue.unfinished.Set(total)
	q.metrics.queue.longestRunning.Set(longest)
}

// Len is the number of deliveries waiting for a worker.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ready)
}

// ShutDown stops handing out deliveries; those still waiting are left to their sessions,
// which close gracefully (the dispatcher gives their keys to other replicas at once).
func (q *Queue) ShutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shuttingDown = true
	q.cond.Broadcast()
}

// ShutDownWithDrain is ShutDown: deliveries with a worker end on their own.
func (q *Queue) ShutDownWithDrain() { q.ShutDown() }

// ShuttingDown reports whether ShutDown was called.
func (q *Queue) ShuttingDown() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.shuttingDown
}

// Add is ignored: what to reconcile is the dispatchers' to say.
func (q *Queue) Add(reconcile.Request) {}

// AddAfter is ignored: a requeue is reported in the ack (reconcile.Result.RequeueAfter).
func (q *Queue) AddAfter(reconcile.Request, time.Duration) {}

// AddRateLimited is ignored: a failure is reported in the ack, and the dispatcher backs off.
func (q *Queue) AddRateLimited(reconcile.Request) {}

// Forget is ignored: the dispatcher keeps each key's failure count.
func (q *Queue) Forget(reconcile.Request) {}

// NumRequeues is the number of failed attempts the dispatcher counted before this delivery.
func (q *Queue) NumRequeues(item reconcile.Request) int {
	if d := q.Delivery(item.NamespacedName); d != nil {
		return int(d.Request.GetAttempt())
	}
	return 0
}

// AckFor turns what a reconcile returned into its acknowledgement: success; a requeue after
// RequeueAfter (capped at seven days); a failure, for the dispatcher to retry with backoff, on
// an error or a Requeue without delay; success on a terminal error (reconcile.TerminalError),
// which controller-runtime does not retry either.
func AckFor(result reconcile.Result, err error) *pb.AckItem {
	switch {
	case err != nil && errors.Is(err, reconcile.TerminalError(nil)):
		return &pb.AckItem{Outcome: &pb.AckItem_Success{Success: &pb.Success{}}}
	case err != nil:
		return &pb.AckItem{Outcome: &pb.AckItem_Failure{Failure: &pb.Failure{Message: failureMessage(err)}}}
	case result.RequeueAfter > 0:
		after := min(max(result.RequeueAfter, time.Millisecond), maxRequeue)
		return &pb.AckItem{Outcome: &pb.AckItem_Requeue{Requeue: &pb.Requeue{After: durationpb.New(after)}}}
	//lint:ignore SA1019 Requeue is deprecated but still honoured, as controller-runtime does.
	case result.Requeue:
		return &pb.AckItem{Outcome: &pb.AckItem_Failure{Failure: &pb.Failure{Message: "requeue requested"}}}
	default:
		return &pb.AckItem{Outcome: &pb.AckItem_Success{Success: &pb.Success{}}}
	}
}

// failureMessage is err's text as an ack carries it: valid UTF-8 (a proto string must be, or
// the whole batch of acks fails to encode), at most maxFailureMessage bytes, cut between
// characters.
func failureMessage(err error) string {
	message := strings.ToValidUTF8(err.Error(), "\uFFFD")
	if len(message) <= maxFailureMessage {
		return message
	}
	cut := maxFailureMessage
	for cut > 0 && !utf8.RuneStart(message[cut]) {
		cut--
	}
	return message[:cut]
}
