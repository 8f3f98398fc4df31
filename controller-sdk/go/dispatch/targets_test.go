package dispatch

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
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

// recordingLoadBalancer assigns the dispatchers "a:1" and "b:2" to the first registration and
// ends its stream (as a leader that stops leading does); it holds every later one open. It
// records what each registration said the replica polls.
type recordingLoadBalancer struct {
	pb.UnimplementedLoadBalancerServer
	mu     sync.Mutex
	polled [][]string
	again  chan struct{}
}

func (l *recordingLoadBalancer) Register(request *pb.RegisterRequest, stream grpc.ServerStreamingServer[pb.Assignment]) error {
	l.mu.Lock()
	l.polled = append(l.polled, slices.Clone(request.GetDispatchers()))
	first := len(l.polled) == 1
	l.mu.Unlock()
	if first {
		return stream.Send(&pb.Assignment{Dispatchers: []string{"a:1", "b:2"}, Generation: 1})
	}
	close(l.again)
	<-stream.Context().Done()
	return nil
}

// A replica registering again says which dispatchers it polls, so that a load balancer that
// has just become the leader places it there and a change of leader moves no session.
func TestARegistrationSaysWhichDispatchersTheReplicaPolls(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb := &recordingLoadBalancer{again: make(chan struct{})}
	server := grpc.NewServer()
	pb.RegisterLoadBalancerServer(server, lb)
	go func() { _ = server.Serve(listener) }()
	defer server.Stop()

	r := &runner{Sessions: &engine.Sessions{Log: logr.Discard(), Open: &pb.OpenSessionRequest{Group: "g", ReplicaId: "r"}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.followLoadBalancer(ctx, listener.Addr().String(), func([]string) {})
	select {
	case <-lb.again:
	case <-time.After(10 * time.Second):
		t.Fatal("the replica did not register again")
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if len(lb.polled[0]) != 0 || !slices.Equal(lb.polled[1], []string{"a:1", "b:2"}) {
		t.Fatalf("registrations said the replica polls %q, want nothing and then a:1, b:2", lb.polled)
	}
}

// No load balancer answers from the start: the replica looks up the dispatcher Service once
// registration has failed for 10 s and polls what it names.
func TestAReplicaWithNoLoadBalancerPollsWhatTheServiceNames(t *testing.T) {
	t.Parallel()
	// A port nobody listens on.
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unreachable := listener.Addr().String()
	_ = listener.Close()
	service := &fakeService{names: map[string][]netip.AddrPort{
		"dispatchers.test:7070": {netip.MustParseAddrPort("127.0.0.1:7070")},
	}}
	r := &runner{
		Sessions:          &engine.Sessions{Log: logr.Discard(), Open: &pb.OpenSessionRequest{Group: "g", ReplicaId: "r"}},
		dispatcherService: "dispatchers.test:7070",
		resolver:          service.resolve,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	polled := make(chan []string, 1)
	started := time.Now()
	go r.followLoadBalancer(ctx, unreachable, func(p []string) { polled <- p })
	select {
	case p := <-polled:
		if !slices.Equal(p, []string{"127.0.0.1:7070"}) {
			t.Fatalf("polled %q", p)
		}
		if waited := time.Since(started); waited < fallbackAfter {
			t.Fatalf("the Service was polled after %v", waited)
		}
	case <-time.After(fallbackAfter + resolveEvery + 10*time.Second):
		t.Fatal("the replica never polled what the Service names")
	}
}
