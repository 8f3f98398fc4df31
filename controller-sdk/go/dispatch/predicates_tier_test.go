package dispatch_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
)

// A label predicate given as the event filter is applied by the dispatchers: a change of the
// data alone is not delivered, a change of the labels is, at its own version.
func TestALabelPredicateIsAppliedByTheDispatchers(t *testing.T) {
	s := newScene(t, 1, 1)
	delivered := make(chan dispatch.Delivery, 16)
	replica(t, s.config, s.tier, "go-labels", "go-0", newLog(), 0, func(c *setup) {
		c.builder.WithEventFilter(predicate.LabelChangedPredicate{})
		c.reconciler = func(client.Client) reconcile.Reconciler {
			return reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
				d, _ := dispatch.DeliveryOf(ctx)
				delivered <- d
				return reconcile.Result{}, nil
			})
		}
	})
	next := func() dispatch.Delivery {
		t.Helper()
		select {
		case d := <-delivered:
			return d
		case <-time.After(30 * time.Second):
			t.Fatal("nothing delivered within 30 s")
			return dispatch.Delivery{}
		}
	}
	if d := next(); d.Reason != "added" {
		t.Fatalf("first delivery %+v, want the creation", d)
	}
	cms := s.clientset.CoreV1().ConfigMaps(s.tier.Namespace)
	change(t, s.clientset, s.tier.Namespace, 0, "data only")
	cm, err := cms.Get(context.Background(), "cm-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dataOnly := cm.ResourceVersion
	cm.Labels["tier"] = "a"
	labelled, err := cms.Update(context.Background(), cm, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Changes of one key arrive in order: had the data change been delivered, it would come
	// first (or joined with the label change, which a key in flight or idle never is).
	d := next()
	if d.Reason != "modified" || d.ResourceVersion != labelled.ResourceVersion {
		t.Fatalf("delivered %+v after the data change at %s and the label change at %s; want only the label change", d, dataOnly, labelled.ResourceVersion)
	}
}
