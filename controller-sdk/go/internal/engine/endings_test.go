package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// ackRecorder is a dispatcher client that records the acks it is sent.
type ackRecorder struct {
	pb.DispatcherClient
	acks chan *pb.AckRequest
}

func (a *ackRecorder) Ack(_ context.Context, in *pb.AckRequest, _ ...grpc.CallOption) (*pb.AckResponse, error) {
	a.acks <- in
	return &pb.AckResponse{}, nil
}

func openAt(e *Endings, dispatcher, id string, client pb.DispatcherClient) (*Session, context.Context) {
	named, fail := context.WithCancelCause(context.Background())
	s := &Session{id: id, ctx: context.Background(), named: named, client: client, dispatcherID: dispatcher}
	e.opened(dispatcher, s, fail)
	return s, named
}

// A session open on a dispatcher named dead is ended; once it has ended it is reported while
// some open session's last answer names its dispatcher dead, at once with an ack of the
// session on the live dispatcher, and a session on a live dispatcher is not.
func TestSessionsOnDispatchersNamedDeadAreEndedThenReported(t *testing.T) {
	e := NewEndings(logr.Discard())
	d2 := &ackRecorder{acks: make(chan *pb.AckRequest, 4)}
	_, onD1 := openAt(e, "d1", "s1", nil)
	_, onD2 := openAt(e, "d2", "s2", d2)
	e.ended("d3", "s3")
	if got := e.reports(); len(got) != 0 {
		t.Fatalf("nobody named dead, yet reports %v", got)
	}
	e.namedDead("d2", []string{"d1"}, false)
	if !errors.Is(context.Cause(onD1), errNamedDead) || onD2.Err() != nil {
		t.Fatalf("d1's session must end, d2's not: %v, %v", context.Cause(onD1), onD2.Err())
	}
	if got := e.reports(); len(got) != 0 {
		t.Fatalf("s1 has not ended yet, yet reports %v", got)
	}
	e.ended("d1", "s1")
	got := e.reports()
	if len(got) != 1 || got[0].GetDispatcherId() != "d1" || got[0].GetSessionId() != "s1" {
		t.Fatalf("reports %v, want d1/s1", got)
	}
	select {
	case ack := <-d2.acks:
		if ack.GetSessionId() != "s2" || len(ack.GetEndedSessions()) != 1 || ack.GetEndedSessions()[0].GetSessionId() != "s1" {
			t.Fatalf("ack %v, want s2 reporting s1", ack)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the ended session was not reported with an ack")
	}
	// A session opened on a dispatcher named dead is not ended for it (a dead or cut-off
	// dispatcher cannot list it); named again, it is.
	_, again := openAt(e, "d1", "s4", nil)
	if again.Err() != nil {
		t.Fatal("a session opened on a dispatcher named dead must not end at once")
	}
	e.namedDead("d2", []string{"d1", "d3"}, false)
	if again.Err() == nil {
		t.Fatal("a session open on a dispatcher named dead must end")
	}
	if got := e.reports(); len(got) != 2 {
		t.Fatalf("s3 ended before d3 was named dead: reports %v", got)
	}
	select {
	case ack := <-d2.acks:
		if len(ack.GetEndedSessions()) != 2 {
			t.Fatalf("ack %v, want both reports", ack)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("naming d3 dead did not report s3 at once")
	}
	e.ended("d1", "s4")
	if got := e.reports(); len(got) != 3 {
		t.Fatalf("both of d1's sessions and s3: reports %v", got)
	}
	// d2's next answer names nobody: nothing is reported any more.
	e.namedDead("d2", nil, false)
	if got := e.reports(); len(got) != 0 {
		t.Fatalf("nobody named dead, yet reports %v", got)
	}
}

// A dispatcher restarted after a crash says its previous process died: the sessions ended on
// its id are reported, at once with an ack of the new session, which goes on; a dispatcher
// naming itself among the dead ends nothing either.
func TestARestartedDispatchersPreviousSessionsAreReportedWithoutEndingItsNewOne(t *testing.T) {
	e := NewEndings(logr.Discard())
	d1 := &ackRecorder{acks: make(chan *pb.AckRequest, 4)}
	openAt(e, "d1", "old", nil)
	e.ended("d1", "old")
	_, onNew := openAt(e, "d1", "new", d1)
	e.namedDead("d1", []string{"d1"}, false)
	if onNew.Err() != nil || len(e.reports()) != 0 {
		t.Fatalf("naming itself dead ends nothing and reports nothing: %v, %v", onNew.Err(), e.reports())
	}
	e.namedDead("d1", nil, true)
	if onNew.Err() != nil {
		t.Fatal("the new process's session must go on")
	}
	got := e.reports()
	if len(got) != 1 || got[0].GetDispatcherId() != "d1" || got[0].GetSessionId() != "old" {
		t.Fatalf("reports %v, want d1/old", got)
	}
	select {
	case ack := <-d1.acks:
		if ack.GetSessionId() != "new" || len(ack.GetEndedSessions()) != 1 || ack.GetEndedSessions()[0].GetSessionId() != "old" {
			t.Fatalf("ack %v, want new reporting old", ack)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the previous process's session was not reported with an ack")
	}
	e.namedDead("d1", nil, false)
	if got := e.reports(); len(got) != 0 {
		t.Fatalf("its wait is over, yet reports %v", got)
	}
}

func TestWhatEndingsRememberIsBounded(t *testing.T) {
	e := NewEndings(logr.Discard())
	var names []string
	for i := 0; i <= endingsKept; i++ {
		name := fmt.Sprintf("d%d", i)
		e.ended(name, "s")
		names = append(names, name)
	}
	for n := 0; n <= endedPerDispatcher; n++ {
		e.ended("d64", fmt.Sprintf("s%d", n))
	}
	openAt(e, "live", "x", &ackRecorder{acks: make(chan *pb.AckRequest, 4)})
	e.namedDead("live", names, false)
	if len(e.done) != endingsKept || len(e.named["live"]) != endingsKept {
		t.Fatalf("kept %d dispatchers' ended sessions and %d named dead, want %d each", len(e.done), len(e.named["live"]), endingsKept)
	}
	for id, list := range e.done {
		if len(list) > endedPerDispatcher {
			t.Fatalf("%d ended sessions kept for %s", len(list), id)
		}
	}
	if got := e.reports(); len(got) != reportsPerCall {
		t.Fatalf("%d reports in one call, want %d", len(got), reportsPerCall)
	}
	// More to report than one call takes: every one goes out within a few calls.
	reportable := 0
	for id, list := range e.done {
		if e.isDead(id) {
			reportable += len(list)
		}
	}
	seen := map[string]bool{}
	for range (reportable + reportsPerCall - 1) / reportsPerCall {
		for _, r := range e.reports() {
			seen[r.GetDispatcherId()+"/"+r.GetSessionId()] = true
		}
	}
	if len(seen) != reportable {
		t.Fatalf("%d of %d sessions reported within %d calls", len(seen), reportable, (reportable+reportsPerCall-1)/reportsPerCall)
	}
}
