package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// A dispatcher answers CloseSession once its Lease lists the session no more
// (dispatcher/HANDOVER.md, "Ending the wait for a member that died, by reports"). Until then,
// were it to die, its next process would wait for a report of the session, and this replica, no
// longer assigned that dispatcher, would never be asked for one. So a close that is not
// confirmed (an error the dispatcher may get over, or no answer in time) is asked again, backing
// off from 250 ms to 2 s, until it is: by the same process once its Lease write goes through, or
// by the next process at the address, which takes the close of a session its previous process
// listed as that session's report. It gives up after closeAgainWindow or when the controller
// stops. At most maxClosingAgain closes are asked again at once in a replica; past it a close is
// left as it was answered.
const maxClosingAgain = 16

// closesAgain counts the closes a replica asks again.
type closesAgain struct{ n atomic.Int32 }

// closeDone says whether a close that answered err is done with: confirmed, or refused for a
// reason asking again would not change. NotFound is done: the dispatcher neither holds nor lists
// the session (or predates confirmed closes).
func closeDone(err error) bool {
	if err == nil {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Unknown, codes.ResourceExhausted,
		codes.Aborted, codes.Internal, codes.Canceled:
		return false
	}
	return true
}

// closeAgainWindow is how long a close of a session granted ttl and maxReconcile is asked
// again: the longer of the two (what the dispatcher's handover bound is made of), at least a
// minute.
func closeAgainWindow(ttl, maxReconcile time.Duration) time.Duration {
	return max(ttl, maxReconcile, time.Minute)
}

// askUntilDone asks after first, then again doubling the wait up to most, until the answer is
// closeDone, window has passed or ctx ends. It returns whether it was done and how many times it
// asked.
func askUntilDone(ctx context.Context, ask func() error, window, first, most time.Duration) (done bool, asked int) {
	deadline := time.Now().Add(window)
	delay := first
	for {
		select {
		case <-ctx.Done():
			return false, asked
		case <-time.After(delay):
		}
		asked++
		if closeDone(ask()) {
			return true, asked
		}
		if !time.Now().Before(deadline) {
			return false, asked
		}
		delay = min(2*delay, most)
	}
}

// closeSession closes session s, whose calls go over conn, once it has drained. A close the
// dispatcher does not confirm is asked again on a goroutine of its own, which takes conn over
// (closeSession then returns true): the session's loop ends now, and a dispatcher assigned again
// gets its next session at once.
func (r *Sessions) closeSession(log logr.Logger, conn *grpc.ClientConn, s *Session, window time.Duration) (keepConn bool) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	// Closed once drained: every reconcile the session handed out has returned.
	_, err := s.client.CloseSession(ctx, &pb.CloseSessionRequest{SessionId: s.id, ReconcilesEnded: true})
	cancel()
	s.cancel(context.Canceled)
	if closeDone(err) {
		log.Info("session closed")
		return false
	}
	log.Info("session closed, but the dispatcher did not confirm its Lease lists it no more: asking again", "error", err.Error())
	go r.closeAgain(conn, s.Address, s.id, window)
	return true
}

// closeAgain asks the close of session id again on conn, which it closes once done, until the
// controller stops (r.Stopped).
func (r *Sessions) closeAgain(conn *grpc.ClientConn, address, id string, window time.Duration) {
	defer func() { _ = conn.Close() }()
	log := r.Log.WithValues("dispatcher", address, "session", id)
	if r.closing.n.Add(1) > maxClosingAgain {
		r.closing.n.Add(-1)
		log.Info("the dispatcher did not confirm the close, and enough closes are asked again already: left as answered (should that dispatcher die now, its next process waits out its handover bound)", "most", maxClosingAgain)
		return
	}
	defer r.closing.n.Add(-1)
	stopped := r.Stopped
	if stopped == nil {
		stopped = context.Background()
	}
	client := pb.NewDispatcherClient(conn)
	done, asked := askUntilDone(stopped, func() error {
		ctx, cancel := context.WithTimeout(stopped, callTimeout)
		defer cancel()
		_, err := client.CloseSession(ctx, &pb.CloseSessionRequest{SessionId: id, ReconcilesEnded: true})
		return err
	}, window, 250*time.Millisecond, 2*time.Second)
	switch {
	case done:
		log.Info("the close is confirmed: the dispatcher's Lease lists the session no more, or its next process took the close as the session's report", "asked", asked)
	case stopped.Err() == nil:
		log.Info("the dispatcher never confirmed the close: should its next process still wait for the session, it waits out its handover bound", "window", window.String())
	}
}
