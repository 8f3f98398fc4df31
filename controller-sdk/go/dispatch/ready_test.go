package dispatch

import (
	"testing"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
)

// SessionsReady passes while every controller built has a session open, forgets one that
// stopped, and fails with none running.
func TestSessionsReadyFollowsTheOpenSessions(t *testing.T) {
	m := engine.NewMetrics("ready-test", "ready-test")
	untrack := trackReadiness(m)
	if SessionsReady(nil) == nil {
		t.Fatal("ready without a session")
	}
	closed := m.SessionOpened("dispatcher-0:7070")
	if err := SessionsReady(nil); err != nil {
		t.Fatalf("not ready with a session open: %v", err)
	}
	closed()
	if SessionsReady(nil) == nil {
		t.Fatal("ready once the session closed")
	}
	untrack()
	if err := SessionsReady(nil); err == nil {
		t.Fatal("ready with no controller running")
	}
}
