package dispatch

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
)

// runner keeps the controller's sessions, as a manager.Runnable that needs no leader
// election: every replica runs, and the dispatchers share the objects among them.
type runner struct {
	// Sessions serves the sessions with the dispatchers the runner is given.
	*engine.Sessions
	credentials  Credentials
	loadBalancer string
	dispatchers  []string
	// dispatcherService and resolver find dispatchers while no load balancer answers.
	dispatcherService string
	resolver          Resolver
	requests          <-chan reconcile.Request
	everything        <-chan struct{}
	// untrack takes the controller out of SessionsReady once it stops.
	untrack func()
	// elected is the manager's: closed once it leads, at once when it runs no election.
	elected <-chan struct{}
}

// electionGrace is how long a runner waits for its manager to lead before warning that the
// manager runs leader election, which the tier makes unnecessary.
const electionGrace = 10 * time.Second

// warnOnLeaderElection logs once when the manager still waits to be elected electionGrace
// after the runner started (it runs leader election and is a standby): the tier needs none,
// and this replica reconciles all the same.
func (r *runner) warnOnLeaderElection(ctx context.Context) {
	timer := time.NewTimer(electionGrace)
	defer timer.Stop()
	select {
	case <-r.elected:
	case <-ctx.Done():
	case <-timer.C:
		r.Log.Info("the manager runs leader election and waits to lead: the tier needs none, and this replica reconciles its share all the same; set the manager's LeaderElection to false (drop --leader-elect)")
	}
}

var (
	_ manager.Runnable               = (*runner)(nil)
	_ manager.LeaderElectionRunnable = (*runner)(nil)
)

// Start runs the sessions until ctx ends, then closes them gracefully.
func (r *runner) Start(ctx context.Context) error {
	// Until the last reconcile has ended (graceful stops let them finish after ctx ends).
	stopped := make(chan struct{})
	defer close(stopped)
	defer r.untrack()
	// The last figures: nothing runs any more.
	defer r.Queue.UpdateUnfinished()
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopped:
				return
			case <-tick.C:
				r.Queue.UpdateUnfinished()
			}
		}
	}()
	go r.warnOnLeaderElection(ctx)
	if r.requests != nil || r.everything != nil {
		go r.Triggers.Follow(ctx, r.requests, r.everything)
		go r.Triggers.Send(ctx, r.Log)
	}
	r.Stopped = ctx
	s := newSupervisor(ctx, r)
	if len(r.dispatchers) > 0 {
		s.assign(r.dispatchers)
		s.wait()
		return nil
	}
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		r.followLoadBalancer(ctx, r.loadBalancer, s.assign)
	}()
	s.wait()
	<-followed
	return nil
}

// NeedLeaderElection is false: every replica serves its share.
func (r *runner) NeedLeaderElection() bool { return false }
