package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/fence"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

const (
	// maxAnswerBytes is the largest poll answer taken (the gRPC decoding limit, told to the
	// dispatcher, which keeps its answers within it).
	maxAnswerBytes = 16 << 20
	// openTimeout bounds OpenSession, which waits for the group's first lists.
	openTimeout = 2 * time.Minute
	// callTimeout bounds an ack, a close and a trigger.
	callTimeout = 10 * time.Second
	// ackBatch is the most acks sent in one call (the dispatcher takes 10 000).
	ackBatch = 1000
	// DefaultTTL and defaultMaxReconcile apply when the dispatcher's answer leaves them out.
	DefaultTTL          = 10 * time.Second
	defaultMaxReconcile = 60 * time.Second
)

// Sessions serves one controller's sessions: one at a time with each dispatcher it is given
// (Loop), each renewed within its fence, its deliveries put on Queue and their acks sent back.
type Sessions struct {
	Log logr.Logger
	// Open is the request every session opens with: the group, the replica, the subscriptions.
	Open *pb.OpenSessionRequest
	// Dial connects to a dispatcher with the controller's credentials.
	Dial     func(address string, options ...grpc.DialOption) (*grpc.ClientConn, error)
	Queue    *Queue
	Endings  *Endings
	Metrics  *Metrics
	Triggers *Triggers
	// Stopped ends when the controller stops: closes the dispatchers did not confirm are asked
	// again until then (closeagain.go). Nil: until they are done or their window passes.
	Stopped context.Context
	closing closesAgain
}

// Session is one open session with one dispatcher.
type Session struct {
	Address string
	id      string
	client  pb.DispatcherClient
	// ctx is cancelled when the session ends: with errFenced when it was lost (every delivery's
	// context ends with it), with context.Canceled once it closed gracefully.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// named ends (with errNamedDead) when a live dispatcher names this session's dispatcher
	// dead: every call of the session ends with it, and the session is lost.
	named context.Context
	// dispatcherID is the identity of the dispatcher that holds the session.
	dispatcherID string

	mu sync.Mutex
	// pending acks, sent in order by sendAcks; at most one per delivery accepted.
	pending []*pb.AckItem
	// outstanding counts deliveries accepted and not finished.
	outstanding int
	// acked is signalled (without blocking) when an ack is queued, for sendAcks; finished
	// when a delivery finishes, for drain and waitForReconciles. Apart, so that neither
	// reader takes the other's wake-up.
	acked    chan struct{}
	finished chan struct{}
}

// DetachedSession is a session open with no dispatcher, at address: deliveries accepted for it
// run and are acknowledged into its pending list, which nothing sends. For tests of what a
// reconcile sees of its delivery.
func DetachedSession(address string) *Session {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Session{Address: address, id: "s", ctx: ctx, cancel: cancel, acked: make(chan struct{}, 1), finished: make(chan struct{}, 1)}
}

// ack queues an acknowledgement; it never blocks (it is called with the queue's lock held).
func (s *Session) ack(item *pb.AckItem) {
	s.mu.Lock()
	s.pending = append(s.pending, item)
	s.mu.Unlock()
	wake(s.acked)
}

// Pending are the acks queued and not sent yet.
func (s *Session) Pending() []*pb.AckItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.pending)
}

// track counts deliveries accepted (+1) and finished (-1).
func (s *Session) track(n int) {
	s.mu.Lock()
	s.outstanding += n
	s.mu.Unlock()
	wake(s.finished)
}

// wake signals c without blocking (c has room for one signal).
func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (s *Session) state() (pending, outstanding int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending), s.outstanding
}

// sendAcks sends queued acks until stop is closed and none is left, in batches, one call at a
// time. A failed call is logged and dropped: the dispatcher delivers those keys again after
// their maximum reconcile time.
func (s *Session) sendAcks(log logr.Logger, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		s.mu.Lock()
		batch := s.pending[:min(len(s.pending), ackBatch)]
		s.pending = s.pending[len(batch):]
		s.mu.Unlock()
		if len(batch) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			_, err := s.client.Ack(ctx, &pb.AckRequest{SessionId: s.id, Acks: batch})
			cancel()
			if err != nil {
				log.V(1).Info("ack failed; the dispatcher will deliver those keys again", "session", s.id, "error", err.Error())
			}
			continue
		}
		select {
		case <-s.acked:
		case <-stop:
			if pending, _ := s.state(); pending == 0 {
				return
			}
		}
	}
}

// errNotRenewed ends a session whose fence passed before a renewal was answered.
var errNotRenewed = status.Error(codes.DeadlineExceeded, "session not renewed in time")

// runSession opens a session with the dispatcher at address and serves it until ctx ends (then
// it closes gracefully: running reconciles finish while the session is renewed, their acks are
// sent, and the session is closed so the dispatcher hands the keys elsewhere at once) or the
// session is lost (then every reconcile it delivered is cancelled, none is acknowledged, and
// runSession returns once all of them have returned). opened says whether a session was opened
// (a session that worked restarts the reconnect backoff).
func (r *Sessions) runSession(ctx context.Context, address string) (opened bool, err error) {
	conn, err := r.Dial(address, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAnswerBytes)))
	if err != nil {
		return false, err
	}
	// Closed on return, unless a close to ask again takes it over (closeAgain).
	keepConn := false
	defer func() {
		if !keepConn {
			_ = conn.Close()
		}
	}()
	client := pb.NewDispatcherClient(conn)
	sent := time.Now()
	openCtx, cancelOpen := context.WithTimeout(ctx, openTimeout)
	var trailer metadata.MD
	answer, err := client.OpenSession(openCtx, r.Open, grpc.Trailer(&trailer))
	cancelOpen()
	if err != nil {
		if wait, ok := pushback(trailer); ok {
			return false, &pushedBackError{err: err, wait: wait}
		}
		return false, err
	}
	if missing := missingCapabilities(r.Open.GetSubscriptions(), answer.GetCapabilities()); len(missing) > 0 {
		closeCtx, cancelClose := context.WithTimeout(context.Background(), callTimeout)
		_, _ = client.CloseSession(closeCtx, &pb.CloseSessionRequest{SessionId: answer.GetSessionId()})
		cancelClose()
		version := answer.GetDispatcherVersion()
		if version == "" {
			version = "unknown, before 0.1.0"
		}
		return false, &tooOldError{fmt.Sprintf("dispatcher %s (version %s) does not serve %s, which this controller's subscriptions need: upgrade the dispatchers",
			address, version, strings.Join(missing, ", "))}
	}
	ttl, maxReconcile := DefaultTTL, defaultMaxReconcile
	if answer.GetTtl() != nil {
		ttl = answer.GetTtl().AsDuration()
	}
	if answer.GetMaxReconcileTime() != nil {
		maxReconcile = answer.GetMaxReconcileTime().AsDuration()
	}
	if ttl <= 0 || maxReconcile <= 0 {
		return false, fmt.Errorf("the dispatcher granted a ttl of %v and a maximum reconcile time of %v: both must be positive", ttl, maxReconcile)
	}
	f := fence.New(ttl, maxReconcile, sent)
	sctx, cancel := context.WithCancelCause(context.Background())
	named, nameDead := context.WithCancelCause(context.Background())
	defer nameDead(context.Canceled)
	s := &Session{
		Address:      address,
		id:           answer.GetSessionId(),
		client:       client,
		ctx:          sctx,
		cancel:       cancel,
		named:        named,
		dispatcherID: answer.GetDispatcherId(),
		acked:        make(chan struct{}, 1),
		finished:     make(chan struct{}, 1),
	}
	dispatcherID := s.dispatcherID
	r.Endings.opened(dispatcherID, s, nameDead)
	r.Endings.namedDead(dispatcherID, answer.GetDeadDispatchers(), answer.GetPreviousProcessDied())
	log := r.Log.WithValues("dispatcher", address, "session", s.id)
	log.Info("session opened", "ttl", ttl.String(), "maxReconcileTime", maxReconcile.String(), "dispatcherVersion", answer.GetDispatcherVersion())
	defer r.Metrics.SessionOpened(address)()
	r.Triggers.sessionOpened(s)
	defer r.Triggers.sessionClosed(s)
	stopAcks, acksDone := make(chan struct{}), make(chan struct{})
	go s.sendAcks(log, stopAcks, acksDone)

	err = r.serve(ctx, s, &f, time.Since(sent))
	if err == nil {
		err = r.drain(s, &f)
	}
	if err != nil {
		// Lost: whatever this session handed out may go to another replica now.
		s.cancel(ErrFenced)
		close(stopAcks)
		r.Queue.dropSession(s, false)
		r.waitForReconciles(log, s)
		// Only now may the session be reported ended.
		r.Endings.ended(dispatcherID, s.id)
		return true, err
	}
	// Every reconcile has returned: the session may be reported ended.
	r.Endings.ended(dispatcherID, s.id)
	close(stopAcks)
	select {
	case <-acksDone:
	case <-time.After(5 * time.Second):
	}
	keepConn = r.closeSession(log, conn, s, closeAgainWindow(ttl, maxReconcile))
	return true, nil
}

// releaseBound is the longest a stopping replica's request to answer its held poll is given:
// past it, the poll ends with its wait anyway.
const releaseBound = 5 * time.Second

// releaseOnStop tells the dispatcher, if ctx ends before the poll in flight is answered, that
// this replica is stopping (AckRequest.stopping): it answers the held poll at once, so the stop
// does not wait out the poll's wait. A dispatcher older than the field ignores it.
func (s *Session) releaseOnStop(ctx context.Context, answered <-chan struct{}) {
	select {
	case <-answered:
	case <-ctx.Done():
		call, cancel := context.WithTimeout(s.named, releaseBound)
		defer cancel()
		_, _ = s.client.Ack(call, &pb.AckRequest{SessionId: s.id, Stopping: true})
	}
}

// serve polls for work while ctx lasts, asking for the free slots and, while reconciles are
// quick, a few more (Queue.free), and renews the session without taking work while there is
// nothing to ask for. It returns nil when ctx ends, and the
// reason when the session is lost.
func (r *Sessions) serve(ctx context.Context, s *Session, f *fence.Fence, roundTrip time.Duration) error {
	defer r.Queue.serving()()
	for ctx.Err() == nil {
		now := time.Now()
		lostAt := f.LostAt()
		if !now.Before(lostAt) {
			return errNotRenewed
		}
		wait := f.WaitAt(now, roundTrip)
		free := r.Queue.free(f.ReconcileLimit())
		if free == 0 {
			// Every slot is busy and enough wait: poll again once one frees, and renew with an empty ack only
			// if none does before the fence needs it (it was renewed at once before, a call
			// per poll of a busy replica).
			select {
			case <-r.Queue.freed:
				continue
			case <-ctx.Done():
				continue
			case <-s.named.Done():
				return s.renewalError(context.Cause(s.named))
			case <-time.After(wait):
			}
			sent := time.Now()
			call, cancelCall := context.WithDeadline(s.named, lostAt)
			_, err := s.client.Ack(call, &pb.AckRequest{SessionId: s.id})
			cancelCall()
			if err != nil {
				return s.renewalError(err)
			}
			f.Renew(sent, 0)
			roundTrip = time.Since(sent)
			continue
		}
		sent := time.Now()
		// Not cancelled by ctx: a poll in flight when the controller stops is answered within
		// its wait, and what it delivers is handed straight back (below) rather than left in
		// flight until the session would expire.
		call, cancelCall := context.WithDeadline(s.named, lostAt)
		answered := make(chan struct{})
		go s.releaseOnStop(ctx, answered)
		answer, err := s.client.Poll(call, &pb.PollRequest{
			SessionId:     s.id,
			MaxItems:      uint32(min(free, 1<<31)),
			Wait:          durationpb.New(wait),
			MaxBytes:      maxAnswerBytes,
			EndedSessions: r.Endings.reports(),
		})
		close(answered)
		cancelCall()
		if err != nil {
			return s.renewalError(err)
		}
		r.Endings.namedDead(s.dispatcherID, answer.GetDeadDispatchers(), answer.GetPreviousProcessDied())
		// The dispatcher cannot have held the poll longer than it took: a larger figure would
		// move the fence past the dispatcher's own expiry.
		held := min(max(answer.GetHeld().AsDuration(), 0), time.Since(sent))
		delivered := f.Renew(sent, held)
		roundTrip = max(time.Since(sent)-held, 0)
		if len(answer.GetRequests()) == 0 {
			continue
		}
		if ctx.Err() != nil {
			// Stopping: not run here; the dispatcher gives them to another replica at once.
			for _, request := range answer.GetRequests() {
				s.ack(notRunHere(request))
			}
			break
		}
		r.Queue.Accept(s, answer.GetRequests(), f.ReconcileDeadline(delivered), f.ReconcileLimit())
	}
	return nil
}

// drain waits for the session's reconciles to end, renewing the session every poll wait, and
// hands back the deliveries still waiting for a worker. It fails, for the caller to cancel
// what still runs, when a renewal fails or the fence passes first.
func (r *Sessions) drain(s *Session, f *fence.Fence) error {
	r.Queue.dropSession(s, true)
	for {
		if _, outstanding := s.state(); outstanding == 0 {
			return nil
		}
		lostAt := f.LostAt()
		if !time.Now().Before(lostAt) {
			return errNotRenewed
		}
		sent := time.Now()
		call, cancel := context.WithDeadline(s.named, lostAt)
		_, err := s.client.Ack(call, &pb.AckRequest{SessionId: s.id})
		cancel()
		if err != nil {
			return s.renewalError(err)
		}
		f.Renew(sent, 0)
		// The next renewal after a poll wait, and never past the fence.
		timer := time.NewTimer(min(f.PollWait(), time.Until(f.LostAt())))
	wait:
		for {
			select {
			case <-s.finished:
				if _, outstanding := s.state(); outstanding == 0 {
					timer.Stop()
					return nil
				}
			case <-timer.C:
				break wait
			case <-s.named.Done():
				// Its dispatcher was found dead: nothing is gained by letting the reconciles
				// run, and the others wait for this session's end.
				timer.Stop()
				return context.Cause(s.named)
			}
		}
	}
}

// waitForReconciles waits until every reconcile s delivered has returned: none may still run
// when the replica opens a session again (its key may be with another replica by then).
// Reconcilers must return soon after their context ends.
func (r *Sessions) waitForReconciles(log logr.Logger, s *Session) {
	warn := time.NewTicker(10 * time.Second)
	defer warn.Stop()
	for {
		_, outstanding := s.state()
		if outstanding == 0 {
			return
		}
		select {
		case <-s.finished:
		case <-warn.C:
			log.Info("reconciles of a lost session still running after their context ended: reconcilers must return when their context is done", "running", outstanding)
		}
	}
}

// renewalError is what a failed renewal of s says: its dispatcher named dead, or a deadline
// being the fence.
func (s *Session) renewalError(err error) error {
	if s.named.Err() != nil {
		return context.Cause(s.named)
	}
	if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
		return errNotRenewed
	}
	return err
}

// notRunHere acknowledges a request this replica will not run, for the dispatcher to deliver
// it again at once, without counting a failure.
func notRunHere(request *pb.ReconcileRequest) *pb.AckItem {
	return &pb.AckItem{
		DeliveryId: request.GetDeliveryId(),
		Outcome:    &pb.AckItem_Requeue{Requeue: &pb.Requeue{After: durationpb.New(time.Millisecond)}},
		Memo:       request.GetMemo(),
	}
}

// Loop keeps one session open with the dispatcher at address until ctx ends,
// reconnecting with a backoff that starts again after every session that opened.
func (r *Sessions) Loop(ctx context.Context, address string) {
	var reconnects Reconnects
	for ctx.Err() == nil {
		opened, err := r.runSession(ctx, address)
		if err == nil {
			return
		}
		var tooOld *tooOldError
		var delay time.Duration
		if errors.As(err, &tooOld) {
			// Asking again soon would only keep the group the dispatcher made for the refused
			// session alive there.
			delay = tooOldRetry
			r.Log.Error(err, "the dispatcher cannot serve this controller; trying it again later", "dispatcher", address, "delay", delay.String())
		} else {
			delay = reconnects.Next(opened)
			// A dispatcher busy opening sessions says how long to wait: at least that.
			var pushedBack *pushedBackError
			if errors.As(err, &pushedBack) {
				delay = max(delay, pushedBack.wait)
			}
			r.Log.Info("session lost; reconnecting", "dispatcher", address, "error", err.Error(), "delay", delay.String())
		}
		r.Metrics.reconnecting()
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// tooOldRetry is how long a replica waits before asking again a dispatcher that lacks a
// capability its subscriptions need: longer than the idle grace after which the dispatcher
// drops the group it made for the refused session.
const tooOldRetry = 5 * time.Minute

// tooOldError is a session refused because its dispatcher lacks what the subscriptions need.
type tooOldError struct{ message string }

func (e *tooOldError) Error() string { return e.message }

func (s *Session) String() string { return fmt.Sprintf("session %s at %s", s.id, s.Address) }
