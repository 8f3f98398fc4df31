package dispatch_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/scrape"
)

// owners records each reconcile's reason and the children its delivery carried.
type owners struct {
	mu    sync.Mutex
	seen  []ownerReconcile
	owner string
}

type ownerReconcile struct {
	reason   string
	children []string
	complete bool
}

func (o *owners) Reconcile(ctx context.Context, request reconcile.Request) (reconcile.Result, error) {
	if request.Name != o.owner {
		return reconcile.Result{}, nil
	}
	d, _ := dispatch.DeliveryOf(ctx)
	children, complete := dispatch.Children(ctx)
	var names []string
	for _, c := range children {
		names = append(names, fmt.Sprintf("%s/%s@%s", c.Kind, c.Name, c.ResourceVersion))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, ownerReconcile{reason: d.Reason, children: names, complete: complete})
	return reconcile.Result{}, nil
}

// waitFor waits until one reconcile recorded since from matches, and returns it.
func (o *owners) waitFor(t *testing.T, from int, what string, match func(ownerReconcile) bool) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		o.mu.Lock()
		for i := from; i < len(o.seen); i++ {
			if match(o.seen[i]) {
				o.mu.Unlock()
				return i + 1
			}
		}
		seen := slices.Clone(o.seen)
		o.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no reconcile %s within 30 s; reconciles: %+v", what, seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A controller that Owns Secrets and References ServiceAccounts by a field path: its owner is
// reconciled with its children listed (complete) when it changes, when a child changes (reason
// owned, the child's new version listed) and when the object it names changes (reason
// referenced), with no informer and no read of the API server for any of it.
func TestOwnsAndReferencesReconcileTheOwnerWithItsChildren(t *testing.T) {
	s := newScene(t, 2, 0)
	ctx := context.Background()
	namespace := s.tier.Namespace
	o := &owners{owner: "owner"}
	replica(t, s.config, s.tier, "go-owners", "go-0", newLog(), 0, func(setup *setup) {
		setup.builder.Owns(&corev1.Secret{}).References(&corev1.ServiceAccount{}, "data.account")
		setup.reconciler = func(client.Client) reconcile.Reconciler { return o }
	})
	owner, err := s.clientset.CoreV1().ConfigMaps(namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "owner"},
		Data:       map[string]string{"account": "named"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	controller := true
	child, err := s.clientset.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "child", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: &controller,
		}}},
		StringData: map[string]string{"k": "1"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	next := o.waitFor(t, 0, "listing the child", func(r ownerReconcile) bool {
		return r.complete && slices.Equal(r.children, []string{"Secret/child@" + child.ResourceVersion})
	})

	child.StringData = map[string]string{"k": "2"}
	if child, err = s.clientset.CoreV1().Secrets(namespace).Update(ctx, child, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	next = o.waitFor(t, next, "for the changed child", func(r ownerReconcile) bool {
		return r.reason == "owned" && r.complete && slices.Equal(r.children, []string{"Secret/child@" + child.ResourceVersion})
	})

	if _, err := s.clientset.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "named"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	o.waitFor(t, next, "for the object it names", func(r ownerReconcile) bool { return r.reason == "referenced" })
	if got := scrape.Sample(t, "kube_dispatch_api_requests_total", map[string]string{"controller": "go-owners"}); got != 0 {
		t.Fatalf("%v requests to the API server from reconciles that read nothing", got)
	}
}

// With OwnedLabelSelector, the dispatchers watch only the children that carry the label: a
// request lists those, never an unlabelled child of the same owner, and a child that loses the
// label leaves the list (its owner is reconciled for it).
func TestOwnedLabelSelectorListsOnlyTheLabelledChildren(t *testing.T) {
	s := newScene(t, 2, 0)
	ctx := context.Background()
	namespace := s.tier.Namespace
	o := &owners{owner: "owner"}
	owner, err := s.clientset.CoreV1().ConfigMaps(namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "owner"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	controller := true
	reference := []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: &controller,
	}}
	labelled, err := s.clientset.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "in", Labels: map[string]string{"set": "a"}, OwnerReferences: reference},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.clientset.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "out", OwnerReferences: reference},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replica(t, s.config, s.tier, "go-owned-labelled", "go-0", newLog(), 0, func(setup *setup) {
		setup.builder.Owns(&corev1.Secret{})
		setup.options.OwnedLabelSelector = "set=a"
		setup.reconciler = func(client.Client) reconcile.Reconciler { return o }
	})
	listsOut := func(r ownerReconcile) bool {
		return slices.ContainsFunc(r.children, func(c string) bool { return strings.HasPrefix(c, "Secret/out@") })
	}
	next := o.waitFor(t, 0, "listing the labelled child", func(r ownerReconcile) bool {
		return r.complete && slices.Equal(r.children, []string{"Secret/in@" + labelled.ResourceVersion})
	})
	labelled.Labels = nil
	if _, err := s.clientset.CoreV1().Secrets(namespace).Update(ctx, labelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	o.waitFor(t, next, "listing no child once the label is gone", func(r ownerReconcile) bool {
		return r.complete && len(r.children) == 0
	})
	o.mu.Lock()
	defer o.mu.Unlock()
	if i := slices.IndexFunc(o.seen, listsOut); i >= 0 {
		t.Fatalf("an unlabelled child was listed: %+v", o.seen[i])
	}
}
