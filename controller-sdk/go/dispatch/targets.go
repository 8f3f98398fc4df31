package dispatch

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

const (
	// maxRedirects is how many standby redirects in a row are followed before backing off.
	maxRedirects = 3
	// leaveTimeout bounds the Leave a stopping replica sends the load balancer.
	leaveTimeout = 2 * time.Second
)

// followLoadBalancer registers with the load balancer at address and sends each assignment's
// dispatchers to assign, until ctx ends (then it takes its leave, so the load balancer moves
// this replica's place at once). A standby's answer names the leader, which is dialled
// instead; after a failure the dispatchers assigned last stay in force while it registers
// again, from the configured address, with the reconnect backoff, and once it has failed for a
// while the dispatchers the dispatcher Service names are added to them (discovery).
func (r *runner) followLoadBalancer(ctx context.Context, address string, assign func([]string)) {
	credentials := r.credentials.forLoadBalancer(address)
	var backoff engine.Reconnects
	current, redirects := address, 0
	// What the replica polls; each registration names the dispatchers assigned last.
	found := newDiscovery(r.Log, r.dispatcherService, r.resolver, assign)
	go found.run(ctx)
	for ctx.Err() == nil {
		leader, assigned, err := r.register(ctx, credentials, current, found.assignedLast(), found.assignment)
		found.failed()
		if ctx.Err() != nil {
			return
		}
		if leader != "" && redirects < maxRedirects {
			redirects++
			r.Log.Info("redirected to the leading load balancer", "loadBalancer", leader)
			current = leader
			continue
		}
		delay := backoff.Next(assigned)
		switch {
		case err != nil:
			r.Log.Info("cannot register with the load balancer; polling the dispatchers assigned last", "loadBalancer", current, "error", err.Error(), "delay", delay.String())
		case leader != "":
			r.Log.Info("redirected again and again; backing off", "loadBalancer", leader, "delay", delay.String())
		default:
			r.Log.Info("the load balancer ended the registration; registering again", "delay", delay.String())
		}
		current, redirects = address, 0
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// register runs one registration stream, saying the replica polls the dispatchers at polled.
// It returns the leader a standby named, if any, and whether the stream delivered an
// assignment (then the registration worked, however it ended).
func (r *runner) register(ctx context.Context, credentials Credentials, address string, polled []string, assign func([]string)) (leader string, assigned bool, err error) {
	conn, err := credentials.dial(address, grpc.WithKeepaliveParams(keepalive.ClientParameters{
		// A leader that vanishes without closing the connection is noticed within seconds.
		Time:                5 * time.Second,
		Timeout:             5 * time.Second,
		PermitWithoutStream: true,
	}))
	if err != nil {
		return "", false, err
	}
	defer func() { _ = conn.Close() }()
	client := pb.NewLoadBalancerClient(conn)
	// The stream outlives a stop by the Leave below, so its context is not ctx; but a stop
	// while it is being opened (a load balancer that does not answer) abandons it.
	streamCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The load balancer reads the first 64.
	request := &pb.RegisterRequest{Group: r.Open.GetGroup(), ReplicaId: r.Open.GetReplicaId(), Dispatchers: polled[:min(len(polled), 64)]}
	abandon := context.AfterFunc(ctx, cancel)
	stream, err := client.Register(streamCtx, request)
	if !abandon() {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	// The stream is read in its own goroutine so that a stop can take leave at once.
	type message struct {
		assignment *pb.Assignment
		err        error
	}
	messages := make(chan message, 1)
	go func() {
		for {
			a, err := stream.Recv()
			select {
			case messages <- message{a, err}:
			case <-streamCtx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			leaveCtx, cancelLeave := context.WithTimeout(context.Background(), leaveTimeout)
			if _, err := client.Leave(leaveCtx, &pb.LeaveRequest{Group: request.Group, ReplicaId: request.ReplicaId}); err != nil {
				r.Log.Info("could not take leave of the load balancer; it frees this replica's place after its grace", "error", err.Error())
			}
			cancelLeave()
			return "", assigned, nil
		case m := <-messages:
			if errors.Is(m.err, io.EOF) {
				return "", assigned, nil
			}
			if m.err != nil {
				return "", assigned, m.err
			}
			if m.assignment.GetLeader() != "" {
				return m.assignment.GetLeader(), assigned, nil
			}
			assigned = true
			dispatchers := slices.Clone(m.assignment.GetDispatchers())
			slices.Sort(dispatchers)
			r.Log.Info("assigned dispatchers", "generation", m.assignment.GetGeneration(), "dispatchers", dispatchers)
			assign(dispatchers)
		}
	}
}

// supervisor runs one session loop per dispatcher of the current assignment (assign),
// stopping the loops of dispatchers no longer assigned gracefully, until ctx ends; wait then
// waits for every loop to finish. A dispatcher assigned again while its previous loop still
// finishes its reconciles gets its new loop once that one has ended: one session per
// dispatcher at a time.
type supervisor struct {
	log   logr.Logger
	run   func(ctx context.Context, address string)
	ctx   context.Context
	mu    sync.Mutex
	loops map[string]loop
	// ending holds, per dispatcher, the end of a loop stopped and not yet ended (at most one
	// per dispatcher, removed as it ends).
	ending map[string]chan struct{}
	wg     sync.WaitGroup
}

// loop is one dispatcher's session loop: stop ends it, done is closed once it has.
type loop struct {
	stop context.CancelFunc
	done chan struct{}
}

func newSupervisor(ctx context.Context, r *runner) *supervisor {
	return &supervisor{
		log:    r.Log,
		run:    r.Loop,
		ctx:    ctx,
		loops:  make(map[string]loop),
		ending: make(map[string]chan struct{}),
	}
}

// assign makes the running loops those of dispatchers.
func (s *supervisor) assign(dispatchers []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	for address, l := range s.loops {
		if !slices.Contains(dispatchers, address) {
			s.log.Info("no longer assigned: finishing its reconciles and closing the session", "dispatcher", address)
			l.stop()
			s.ending[address] = l.done
			delete(s.loops, address)
		}
	}
	for _, address := range dispatchers {
		if _, running := s.loops[address]; running {
			continue
		}
		ctx, stop := context.WithCancel(s.ctx)
		l := loop{stop: stop, done: make(chan struct{})}
		previous := s.ending[address]
		delete(s.ending, address)
		s.loops[address] = l
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.ended(address, l.done)
			if previous != nil {
				select {
				case <-previous:
				case <-ctx.Done():
					return
				}
			}
			s.run(ctx, address)
		}()
	}
}

// ended marks the loop of address that done belongs to as ended.
func (s *supervisor) ended(address string, done chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(done)
	if s.ending[address] == done {
		delete(s.ending, address)
	}
}

// wait waits for every loop, once ctx has ended.
func (s *supervisor) wait() {
	<-s.ctx.Done()
	s.wg.Wait()
}
