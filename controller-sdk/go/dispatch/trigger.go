package dispatch

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// maxTriggerKeys is the most keys one Trigger call carries (the dispatcher's bound); more
// waiting than that become one "every key" trigger, which covers them.
const maxTriggerKeys = 1000

// triggers are what ReconcileOn and ReconcileAllOn were given, sent to the dispatcher of
// every open session (Dispatcher.Trigger). Each dispatcher takes the keys it serves and
// ignores the others; every replica of a group runs the same triggers, so every dispatcher is
// asked by the replicas connected to it.
//
// Bounds: at most maxTriggerKeys keys wait (past that, every key); a channel is read no faster
// than the dispatchers answer, each call within callTimeout.
type triggers struct {
	mu     sync.Mutex
	keys   map[string]struct{}
	all    bool
	ready  chan struct{}
	open   map[*session]struct{}
	opened chan struct{}
	keyOf  func(reconcile.Request) string
}

func newTriggers(keyOf func(reconcile.Request) string) *triggers {
	return &triggers{
		keys:   map[string]struct{}{},
		ready:  make(chan struct{}, 1),
		open:   map[*session]struct{}{},
		opened: make(chan struct{}, 1),
		keyOf:  keyOf,
	}
}

func (t *triggers) add(request reconcile.Request) {
	if request.Name == "" {
		return
	}
	t.mu.Lock()
	if !t.all {
		t.keys[t.keyOf(request)] = struct{}{}
		if len(t.keys) > maxTriggerKeys {
			clear(t.keys)
			t.all = true
		}
	}
	t.mu.Unlock()
	wake(t.ready)
}

func (t *triggers) addAll() {
	t.mu.Lock()
	clear(t.keys)
	t.all = true
	t.mu.Unlock()
	wake(t.ready)
}

// sessionOpened and sessionClosed keep the set of sessions triggers go to.
func (t *triggers) sessionOpened(s *session) {
	t.mu.Lock()
	t.open[s] = struct{}{}
	t.mu.Unlock()
	wake(t.opened)
}

func (t *triggers) sessionClosed(s *session) {
	t.mu.Lock()
	delete(t.open, s)
	t.mu.Unlock()
}

// take is what waits to be sent and the sessions to send it to, or nothing while no session
// is open (it then keeps waiting).
func (t *triggers) take() (keys []string, all bool, to []*session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.open) == 0 || (len(t.keys) == 0 && !t.all) {
		return nil, false, nil
	}
	for k := range t.keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	all = t.all
	clear(t.keys)
	t.all = false
	for s := range t.open {
		to = append(to, s)
	}
	return keys, all, to
}

// send sends what the channels add until ctx ends.
func (t *triggers) send(ctx context.Context, r *runner) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.ready:
		case <-t.opened:
		}
		keys, all, to := t.take()
		if len(to) == 0 {
			continue
		}
		var wg sync.WaitGroup
		for _, s := range to {
			wg.Go(func() {
				call, cancel := context.WithTimeout(ctx, callTimeout)
				defer cancel()
				_, err := s.client.Trigger(call, &pb.TriggerRequest{SessionId: s.id, Keys: keys, All: all})
				if err != nil {
					r.log.Info("a trigger was refused or not answered; it is not sent again", "dispatcher", s.address, "keys", len(keys), "all", all, "error", err.Error())
				}
			})
		}
		wg.Wait()
	}
}

// follow reads requests and every-key signals from the channels until they close or ctx ends.
func (t *triggers) follow(ctx context.Context, requests <-chan reconcile.Request, everything <-chan struct{}) {
	for requests != nil || everything != nil {
		select {
		case <-ctx.Done():
			return
		case request, ok := <-requests:
			if !ok {
				requests = nil
				continue
			}
			t.add(request)
		case _, ok := <-everything:
			if !ok {
				everything = nil
				continue
			}
			t.addAll()
		}
	}
}

// requestKey is the wire key of an object of the reconciled kind: group/kind/namespace/name
// (proto/kubedispatch/v1/keys.md).
func requestKey(group, kind string) func(reconcile.Request) string {
	return func(r reconcile.Request) string {
		return fmt.Sprintf("%s/%s/%s/%s", group, kind, r.Namespace, r.Name)
	}
}
