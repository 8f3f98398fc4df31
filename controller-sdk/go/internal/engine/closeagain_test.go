package engine

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestOnlyAConfirmedOrFinalAnswerEndsTheAsking(t *testing.T) {
	for _, c := range []struct {
		err  error
		done bool
	}{
		{nil, true},
		{status.Error(codes.NotFound, "no such session"), true},
		{status.Error(codes.PermissionDenied, "not yours"), true},
		{status.Error(codes.Unavailable, "the Lease may still list it"), false},
		{status.Error(codes.DeadlineExceeded, "slow"), false},
		{context.DeadlineExceeded, false},
	} {
		if got := closeDone(c.err); got != c.done {
			t.Errorf("closeDone(%v) = %v, want %v", c.err, got, c.done)
		}
	}
	if w := closeAgainWindow(10*time.Second, 300*time.Second); w != 300*time.Second {
		t.Errorf("window %v, want the longest reconcile", w)
	}
	if w := closeAgainWindow(10*time.Second, 30*time.Second); w != time.Minute {
		t.Errorf("window %v, want a minute at least", w)
	}
}

func TestACloseIsAskedAgainUntilConfirmedTheWindowPassesOrTheControllerStops(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "the Lease may still list it")
	refusing := func(refusals int, last error) (func() error, *int) {
		asked := 0
		return func() error {
			asked++
			if asked > refusals {
				return last
			}
			return unavailable
		}, &asked
	}
	ctx := context.Background()
	ask, asked := refusing(3, nil)
	if done, n := askUntilDone(ctx, ask, time.Minute, time.Millisecond, 4*time.Millisecond); !done || n != 4 || *asked != 4 {
		t.Fatalf("confirmed after %d asks (done %v), want 4", n, done)
	}
	ask, _ = refusing(1, status.Error(codes.NotFound, "no such session"))
	if done, n := askUntilDone(ctx, ask, time.Minute, time.Millisecond, 4*time.Millisecond); !done || n != 2 {
		t.Fatalf("NotFound after %d asks (done %v): nothing listed, nothing more to ask", n, done)
	}
	began := time.Now()
	ask, _ = refusing(1<<30, nil)
	if done, _ := askUntilDone(ctx, ask, 50*time.Millisecond, time.Millisecond, 4*time.Millisecond); done {
		t.Fatal("never confirmed, yet done")
	}
	if took := time.Since(began); took < 50*time.Millisecond || took > 5*time.Second {
		t.Fatalf("gave up after %v, want the window (50ms)", took)
	}
	stopped, stop := context.WithCancel(ctx)
	stop()
	ask, asked = refusing(1<<30, nil)
	if done, n := askUntilDone(stopped, ask, time.Minute, time.Millisecond, 4*time.Millisecond); done || n != 0 || *asked != 0 {
		t.Fatalf("a stopped controller asked %d times", n)
	}
}
