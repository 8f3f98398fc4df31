package engine

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// maxTriggerKeys is the most keys one Trigger call carries (the dispatcher's bound); more
// waiting than that become one "every key" trigger, which covers them.
const maxTriggerKeys = 1000

// Triggers are what ReconcileOn and ReconcileAllOn were given, sent to the dispatcher of
// every open session (Dispatcher.Trigger). Each dispatcher takes the keys it serves and
// ignores the others; every replica of a group runs the same triggers, so every dispatcher is
// asked by the replicas connected to it.
//
// Bounds: at most maxTriggerKeys keys wait (past that, every key); a channel is read no faster
// than the dispatchers answer, each call within callTimeout.
type Triggers struct {
	mu     sync.Mutex
	keys   map[string]struct{}
	all    bool
	ready  chan struct{}
	open   map[*Session]struct{}
	opened chan struct{}
	keyOf  func(reconcile.Request) string
}

func NewTriggers(keyOf func(reconcile.Request) string) *Triggers {
	return &Triggers{
		keys:   map[string]struct{}{},
		ready:  make(chan struct{}, 1),
		open:   map[*Session]struct{}{},
		opened: make(chan struct{}, 1),
		keyOf:  keyOf,
	}
}

func (t *Triggers) add(request reconcile.Request) {
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

func (t *Triggers) addAll() {
	t.mu.Lock()
	clear(t.keys)
	t.all = true
	t.mu.Unlock()
	wake(t.ready)
}

// sessionOpened and sessionClosed keep the set of sessions triggers go to.
func (t *Triggers) sessionOpened(s *Session) {
	t.mu.Lock()
	t.open[s] = struct{}{}
	t.mu.Unlock()
	wake(t.opened)
}

func (t *Triggers) sessionClosed(s *Session) {
	t.mu.Lock()
	delete(t.open, s)
	t.mu.Unlock()
}

// take is what waits to be sent and the sessions to send it to, or nothing while no session
// is open (it then keeps waiting).
func (t *Triggers) take() (keys []string, all bool, to []*Session) {
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

// Send sends what the channels add until ctx ends.
func (t *Triggers) Send(ctx context.Context, log logr.Logger) {
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
					log.Info("a trigger was refused or not answered; it is not sent again", "dispatcher", s.Address, "keys", len(keys), "all", all, "error", err.Error())
				}
			})
		}
		wg.Wait()
	}
}

// Follow reads requests and every-key signals from the channels until they close or ctx ends.
func (t *Triggers) Follow(ctx context.Context, requests <-chan reconcile.Request, everything <-chan struct{}) {
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

// RequestKey is the wire key of an object of the reconciled kind: group/kind/namespace/name
// (proto/kubedispatch/v1/keys.md).
func RequestKey(group, kind string) func(reconcile.Request) string {
	return func(r reconcile.Request) string {
		return fmt.Sprintf("%s/%s/%s/%s", group, kind, r.Namespace, r.Name)
	}
}
