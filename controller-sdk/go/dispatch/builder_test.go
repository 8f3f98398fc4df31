package dispatch_test

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
)

// A port keeps the options it gave controller-runtime's builder. Those the tier cannot serve
// make Build fail, each with what to do instead; none is ignored.
func TestOptionsTheTierDoesNotServeAreRefusedWithTheAlternative(t *testing.T) {
	// Nothing here reaches an API server: the options are judged before the kinds are resolved.
	mgr, err := manager.New(&rest.Config{Host: "https://127.0.0.1:1"}, manager.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	elect := true
	cases := []struct {
		name  string
		build func(*dispatch.Builder) *dispatch.Builder
		want  string
	}{
		{"a function predicate on For", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(client.Object) bool { return true })))
		}, "predicate.TypedFuncs[client.Object] is not applied by the tier"},
		{"predicates on For that must all pass on different parts", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}, builder.WithPredicates(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))
		}, "use predicate.Or"},
		{"an Or holding a predicate the tier cannot apply", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.Funcs{})))
		}, "predicate.TypedFuncs[client.Object] is not applied by the tier"},
		{"a predicate on Owns", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).Owns(&corev1.ConfigMap{}, builder.WithPredicates(predicate.LabelChangedPredicate{}))
		}, "Owns(*v1.ConfigMap, builder.WithPredicates(...))"},
		{"a predicate on Owns, by pointer", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).Owns(&corev1.ConfigMap{}, &builder.Predicates{})
		}, "predicates are not applied here"},
		{"every owner of a child", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).Owns(&corev1.ConfigMap{}, builder.MatchEveryOwner)
		}, "use References"},
		{"a rate limiter", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).WithOptions(controller.Options{
				RateLimiter: workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
			})
		}, "--backoff-*"},
		{"a queue of its own", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).WithOptions(controller.Options{
				NewQueue: func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
					return nil
				},
			})
		}, "NewQueue is the SDK's"},
		{"a priority queue", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).WithOptions(controller.Options{UsePriorityQueue: &elect})
		}, "decide what is delivered when"},
		{"a watch with a map function", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(nothingMapped))
		}, `add References(*v1.Secret, "spec.path")`},
		{"a named watch with a predicate", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(nothingMapped),
				dispatch.NamedAt("spec.secretName"), builder.WithPredicates(predicate.GenerationChangedPredicate{}))
		}, "Watches(*v1.Secret, builder.WithPredicates(...))"},
		{"a metadata watch", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(nothingMapped))
		}, "WatchesMetadata(*v1.Secret, ...)"},
		{"a raw source", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).WatchesRawSource(source.Channel(make(chan event.TypedGenericEvent[client.Object]), &handler.EnqueueRequestForObject{}))
		}, "ReconcileOn"},
		{"an event filter beside Owns", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).WithEventFilter(predicate.GenerationChangedPredicate{}).Owns(&corev1.ConfigMap{})
		}, "give the predicate to For instead"},
		{"a nil predicate", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}, builder.WithPredicates(nil))
		}, "a nil predicate is not applied"},
		{"a nil pointer to predicates", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}, (*builder.Predicates)(nil))
		}, "a nil predicate is not applied"},
		{"a nil event filter", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).WithEventFilter(nil)
		}, "WithEventFilter: a nil predicate"},
		{"a generation predicate with a function of its own", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}, builder.WithPredicates(predicate.GenerationChangedPredicate{
				TypedFuncs: predicate.Funcs{DeleteFunc: func(event.DeleteEvent) bool { return false }},
			}))
		}, "with functions of its own set"},
		{"an event filter the tier cannot apply", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).WithEventFilter(predicate.Funcs{})
		}, "WithEventFilter: predicate.TypedFuncs[client.Object] is not applied"},
		{"an event filter and a For predicate on different parts", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}, builder.WithPredicates(predicate.LabelChangedPredicate{})).WithEventFilter(predicate.GenerationChangedPredicate{})
		}, "combine them with predicate.Or"},
		{"leader election", func(b *dispatch.Builder) *dispatch.Builder {
			return b.For(&appsv1.Deployment{}).WithOptions(controller.Options{NeedLeaderElection: &elect})
		}, "every replica reconciles"},
	}
	nothing := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.build(dispatch.ControllerManagedBy(mgr)).Complete(nothing)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error that says %q, got %v", c.want, err)
			}
		})
	}
}

// The options the tier serves get Build past them (to fail, here, resolving the kind with no
// API server to ask).
func TestOptionsTheTierServesAreTaken(t *testing.T) {
	mgr, err := manager.New(&rest.Config{Host: "https://127.0.0.1:1"}, manager.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	nothing := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	})
	// OnlyMetadata.
	err = dispatch.ControllerManagedBy(mgr).
		For(&appsv1.Deployment{}, builder.OnlyMetadata).
		Owns(&corev1.ConfigMap{}, builder.OnlyMetadata).
		Complete(nothing)
	if err == nil || strings.Contains(err.Error(), "OnlyMetadata") || strings.Contains(err.Error(), "not served") {
		t.Fatalf("OnlyMetadata should be taken, and only the kind's resolution fail: %v", err)
	}
	// A Watches of a kind a References names is served by it.
	err = dispatch.ControllerManagedBy(mgr).
		For(&appsv1.Deployment{}).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(nothingMapped)).
		References(&corev1.Secret{}, "spec.secretName").
		Complete(nothing)
	if err == nil || strings.Contains(err.Error(), "Watches") {
		t.Fatalf("Watches with References of its kind should be taken, and only the kind's resolution fail: %v", err)
	}
	// A Watches told where the For kind names the object is References.
	err = dispatch.ControllerManagedBy(mgr).
		For(&appsv1.Deployment{}).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(nothingMapped), dispatch.NamedAt("spec.secretName")).
		Complete(nothing)
	if err == nil || strings.Contains(err.Error(), "Watches") {
		t.Fatalf("Watches with NamedAt should be taken, and only the kind's resolution fail: %v", err)
	}
	// A generation predicate on For, and a label predicate as the event filter of a controller
	// without children, become the subscription's change filter.
	err = dispatch.ControllerManagedBy(mgr).
		For(&appsv1.Deployment{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithEventFilter(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})).
		Complete(nothing)
	if err == nil || strings.Contains(err.Error(), "predicate") {
		t.Fatalf("the generation and label predicates should be taken, and only the kind's resolution fail: %v", err)
	}
}

func nothingMapped(context.Context, client.Object) []reconcile.Request { return nil }
