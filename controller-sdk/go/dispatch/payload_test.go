package dispatch_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/scrape"
)

// reads records what each reconcile's Get of its object returned against what was delivered.
type reads struct {
	client client.Client
	mu     sync.Mutex
	// found counts the reconciles that read their object at least as new as delivered, gone
	// those of a deletion that read NotFound, by name; wrong says what else happened.
	found, gone map[string]int
	wrong       []string
}

func (r *reads) Reconcile(ctx context.Context, request reconcile.Request) (reconcile.Result, error) {
	d, _ := dispatch.DeliveryOf(ctx)
	var cm corev1.ConfigMap
	err := r.client.Get(ctx, request.NamespacedName, &cm)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case d.Deleted && apierrors.IsNotFound(err):
		r.gone[request.Name]++
	case !d.Deleted && err == nil && !older(cm.ResourceVersion, d.ResourceVersion):
		r.found[request.Name]++
	default:
		r.wrong = append(r.wrong, fmt.Sprintf("%s delivered at %s (deleted %v): read %s, %v", request.Name, d.ResourceVersion, d.Deleted, cm.ResourceVersion, err))
	}
	return reconcile.Result{}, nil
}

// older says whether resourceVersion a is older than b (this API server's are etcd revisions).
func older(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA != nil || errB != nil || x < y
}

func (r *reads) counts() (found, gone int, wrong []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.found {
		found += n
	}
	for _, n := range r.gone {
		gone += n
	}
	return found, gone, append([]string(nil), r.wrong...)
}

// With requests that carry no body, a reconcile's Get of its object reads the API server (its
// watch cache) once, at least as new as the delivery; a deletion reads NotFound without asking
// the API server anything.
func TestKeyOnlyDeliveriesReadOnceAndDeletionsAreNotFound(t *testing.T) {
	s := newScene(t, 2, 10)
	r := &reads{found: map[string]int{}, gone: map[string]int{}}
	replica(t, s.config, s.tier, "go-keyonly", "go-0", newLog(), 0, func(setup *setup) {
		setup.options.Payload = dispatch.PayloadKeyOnly
		setup.reconciler = func(c client.Client) reconcile.Reconciler {
			r.client = c
			return r
		}
	})
	gets := func() float64 {
		return scrape.Sample(t, "kube_dispatch_api_requests_total", map[string]string{"controller": "go-keyonly", "verb": "get"})
	}
	waitFor := func(what string, done func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !done() {
			if time.Now().After(deadline) {
				found, gone, wrong := r.counts()
				t.Fatalf("%s within 30 s: found %d, gone %d, wrong %v", what, found, gone, wrong)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("every object read", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.found) == s.objects
	})
	found, _, _ := r.counts()
	// One GET each; a second only when the watch cache could not serve the version delivered.
	if got := gets(); got < float64(found) || got > 2*float64(found) {
		t.Fatalf("%v GETs for %d reconciles that read their object", got, found)
	}
	before := gets()
	for i := range 3 {
		if err := s.clientset.CoreV1().ConfigMaps(s.tier.Namespace).Delete(context.Background(), fmt.Sprintf("cm-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("the deletions reconciled", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.gone) == 3
	})
	if got := gets() - before; got != 0 {
		t.Fatalf("%v GETs for reconciles of deletions", got)
	}
	if _, _, wrong := r.counts(); len(wrong) > 0 {
		t.Fatalf("reads: %v", wrong)
	}
}

// memos records the memo each reconcile was handed, and leaves the next number.
type memos struct {
	mu   sync.Mutex
	seen []string
}

func (m *memos) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	previous := string(dispatch.Memo(ctx))
	n, _ := strconv.Atoi(previous)
	m.mu.Lock()
	m.seen = append(m.seen, previous)
	m.mu.Unlock()
	return reconcile.Result{}, dispatch.LeaveMemo(ctx, []byte(strconv.Itoa(n+1)))
}

func (m *memos) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.seen)
}

// What a reconcile leaves (LeaveMemo) comes back with the next delivery of its object (Memo),
// carried by its acknowledgement.
func TestALeftMemoComesBackWithTheNextDelivery(t *testing.T) {
	s := newScene(t, 1, 1)
	m := &memos{}
	replica(t, s.config, s.tier, "go-memo", "go-0", newLog(), 0, func(setup *setup) {
		setup.reconciler = func(client.Client) reconcile.Reconciler { return m }
	})
	for round := range 4 {
		deadline := time.Now().Add(30 * time.Second)
		for m.count() <= round {
			if time.Now().After(deadline) {
				t.Fatalf("reconcile %d did not come within 30 s", round+1)
			}
			time.Sleep(10 * time.Millisecond)
		}
		change(t, s.clientset, s.tier.Namespace, 0, fmt.Sprintf("round-%d", round))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, memo := range m.seen {
		want := "" // none left before the first reconcile
		if i > 0 {
			want = strconv.Itoa(i)
		}
		if memo != want {
			t.Fatalf("reconcile %d was handed memo %q, want %q (all: %q)", i+1, memo, want, m.seen)
		}
	}
}
