package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/scrape"
)

// ownerKey indexes Secrets by the name of their controlling ConfigMap, as a kubebuilder
// controller indexes its children.
const ownerKey = ".metadata.controller"

func ownerName(object client.Object) []string {
	owner := metav1.GetControllerOf(object)
	if owner == nil || owner.APIVersion != "v1" || owner.Kind != "ConfigMap" {
		return nil
	}
	return []string{owner.Name}
}

// parents is a controller in the kubebuilder idiom: it lists its children through the owner
// index and creates the ones missing, named after it.
type parents struct {
	client client.Client
	mu     sync.Mutex
	// listed is what each reconcile of an owner listed, in order.
	listed map[string][][]string
	// shown counts the Secret children the requests listed completely, bare those of them
	// without their bodies, and incomplete the requests that did not list them completely.
	shown, bare, incomplete int
	// errs are what went wrong: a child created twice (the list missed it), a list refused.
	errs []error
}

func (p *parents) Reconcile(ctx context.Context, request reconcile.Request) (reconcile.Result, error) {
	var owner corev1.ConfigMap
	if err := p.client.Get(ctx, request.NamespacedName, &owner); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	known, complete := dispatch.Children(ctx)
	p.mu.Lock()
	if complete {
		for _, c := range known {
			if c.Kind == "Secret" {
				p.shown++
				if len(c.Body) == 0 {
					p.bare++
				}
			}
		}
	} else {
		p.incomplete++
	}
	p.mu.Unlock()
	var children corev1.SecretList
	if err := p.client.List(ctx, &children, client.InNamespace(request.Namespace), client.MatchingFields{ownerKey: request.Name}); err != nil {
		p.fail(err)
		return reconcile.Result{}, err
	}
	var names []string
	for _, child := range children.Items {
		names = append(names, child.Name)
	}
	slices.Sort(names)
	p.mu.Lock()
	p.listed[request.Name] = append(p.listed[request.Name], names)
	p.mu.Unlock()
	for _, suffix := range []string{"a", "b"} {
		name := request.Name + "-" + suffix
		if slices.Contains(names, name) {
			continue
		}
		child := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: request.Namespace, Name: name}}
		if err := controllerutil.SetControllerReference(&owner, child, p.client.Scheme()); err != nil {
			return reconcile.Result{}, err
		}
		if err := p.client.Create(ctx, child); err != nil {
			if apierrors.IsAlreadyExists(err) {
				p.fail(fmt.Errorf("the list of %s's children missed %s, which exists", request.Name, name))
			}
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

func (p *parents) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// last is the last list of owner's children, and how many reconciles listed them.
func (p *parents) last(owner string) (names []string, lists int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := p.listed[owner]
	if len(seen) == 0 {
		return nil, 0
	}
	return seen[len(seen)-1], len(seen)
}

// A controller that finds its children through a field index (IndexField on NewCache, then
// List with MatchingFields) lists exactly its own and sees those it created in its next
// reconcile. The SDK takes each child its request lists from the request, where the dispatcher
// sent its body, or reads it by name from the watch cache (a GET of each), or, when the
// request lists none or not all of them or is older than
// the reconcile's own last write, one LIST of the namespace; never more. The index needs a
// namespace, and a field neither indexed nor known to the API server is refused with what to
// do.
func TestAListByIndexFindsTheChildrenWithTheFewestReads(t *testing.T) {
	s := newScene(t, 2, 0)
	ctx := context.Background()
	namespace := s.tier.Namespace
	p := &parents{listed: map[string][][]string{}}
	var mgrClient client.Client
	replica(t, s.config, s.tier, "go-indexed", "go-0", newLog(), 0, func(setup *setup) {
		if err := setup.manager.GetFieldIndexer().IndexField(ctx, &corev1.Secret{}, ownerKey, ownerName); err != nil {
			t.Fatal(err)
		}
		if _, err := setup.manager.GetCache().GetInformer(ctx, &corev1.Secret{}); err == nil {
			t.Fatal("NewCache started an informer")
		}
		setup.builder.Owns(&corev1.Secret{})
		setup.reconciler = func(c client.Client) reconcile.Reconciler {
			p.client, mgrClient = c, c
			return p
		}
	})
	for _, name := range []string{"one", "two"} {
		if _, err := s.clientset.CoreV1().ConfigMaps(namespace).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for _, name := range []string{"one", "two"} {
		for {
			names, _ := p.last(name)
			if slices.Equal(names, []string{name + "-a", name + "-b"}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's reconciles never listed both its children: %v", name, p.listed)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	p.mu.Lock()
	for owner, lists := range p.listed {
		for _, names := range lists {
			for _, name := range names {
				if !strings.HasPrefix(name, owner+"-") {
					t.Errorf("%s's list held %s", owner, name)
				}
			}
		}
	}
	if len(p.errs) > 0 {
		t.Errorf("errors: %v", p.errs)
	}
	reconciles := 0
	for _, lists := range p.listed {
		reconciles += len(lists)
	}
	p.mu.Unlock()
	requests := func(verb string) float64 {
		return scrape.Sample(t, "kube_dispatch_api_requests_total", map[string]string{"controller": "go-indexed", "verb": verb})
	}
	lists, gets := requests("list"), requests("get")
	p.mu.Lock()
	shown, bare := p.shown, p.bare
	p.mu.Unlock()
	if gets > float64(bare) || lists > float64(reconciles) || shown == 0 || bare == shown {
		t.Errorf("%d reconciles, shown %d children (%d without bodies), sent %v LISTs and %v GETs: want a GET of each child shown without its body at most, a LIST per reconcile at most, and children taken from the requests", reconciles, shown, bare, lists, gets)
	}

	var all corev1.SecretList
	if err := mgrClient.List(ctx, &all, client.MatchingFields{ownerKey: "one"}); err == nil || !strings.Contains(err.Error(), "client.InNamespace") {
		t.Errorf("a List by index across every namespace: %v", err)
	}
	err := mgrClient.List(ctx, &all, client.InNamespace(namespace), client.MatchingFields{".spec.unknown": "x"})
	if err == nil || !strings.Contains(err.Error(), "IndexField") || !apierrors.IsBadRequest(errors.Unwrap(err)) {
		t.Errorf("a List by a field neither indexed nor known to the API server: %v", err)
	}
}
