package dispatch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// A dispatcher assigned again while its previous loop still finishes gets its new loop only
// once that one has ended: never two sessions with one dispatcher at once.
func TestAReassignedDispatchersLoopWaitsForItsPreviousOne(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	running, most := 0, 0
	started := make(chan struct{}, 4)
	finish := make(chan struct{})
	s := &supervisor{
		log: logr.Discard(), ctx: ctx,
		loops: make(map[string]loop), ending: make(map[string]chan struct{}),
		run: func(ctx context.Context, _ string) {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			started <- struct{}{}
			<-ctx.Done()
			// Finishing its reconciles after its stop, until the test lets it end.
			<-finish
			mu.Lock()
			running--
			mu.Unlock()
		},
	}
	s.assign([]string{"d-0"})
	<-started
	s.assign(nil)
	s.assign([]string{"d-0"})
	select {
	case <-started:
		t.Fatal("a second loop with d-0 started while the first was still finishing")
	case <-time.After(200 * time.Millisecond):
	}
	close(finish)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the new loop did not start once the previous one ended")
	}
	cancel()
	s.wait()
	if most != 1 {
		t.Fatalf("%d loops with d-0 at once", most)
	}
	if len(s.ending) != 0 {
		t.Fatalf("ended loops still tracked: %v", s.ending)
	}
}
