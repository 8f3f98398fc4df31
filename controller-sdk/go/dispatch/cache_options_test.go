package dispatch_test

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	example "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/configmap-hasher/hasher"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/tiertest"
)

// managerWithCache is a manager on dispatch.NewCache made with the cache options given.
func managerWithCache(config *rest.Config, options cache.Options) (ctrl.Manager, error) {
	return ctrl.NewManager(config, ctrl.Options{
		NewClient:              dispatch.NewClient,
		NewCache:               dispatch.NewCache,
		Cache:                  options,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
}

// A port keeps its manager's cache options. Those the tier cannot serve make the manager or
// Build fail, each saying what to do instead; none is ignored.
func TestCacheOptionsTheTierCannotServeAreRefused(t *testing.T) {
	// Nothing here reaches an API server: the options are judged before the kinds are resolved.
	config := &rest.Config{Host: "https://127.0.0.1:1"}
	_, err := managerWithCache(config, cache.Options{DefaultNamespaces: map[string]cache.Config{"a": {}, "b": {}}})
	if err == nil || !strings.Contains(err.Error(), "names 2 namespaces (a, b)") || !strings.Contains(err.Error(), "run a manager per namespace") {
		t.Errorf("two namespaces: %v", err)
	}
	team := labels.SelectorFromSet(labels.Set{"team": "a"})
	// A cache made alone, without a scheme, names its ByObject kinds by the client's.
	if _, err := dispatch.NewCache(config, cache.Options{ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {Label: team}}}); err != nil {
		t.Errorf("a cache made without a scheme: %v", err)
	}
	cases := []struct {
		name    string
		options cache.Options
		builder func(*dispatch.Builder) *dispatch.Builder
		want    string
	}{
		{"children narrowed by a field", cache.Options{DefaultFieldSelector: fields.OneTermEqualSelector("metadata.name", "x")},
			func(b *dispatch.Builder) *dispatch.Builder { return b.Owns(&corev1.ConfigMap{}) },
			`give ConfigMap the field selector "metadata.name=x": the dispatchers narrow a controller's children by label only`},
		{"children of two kinds narrowed differently", cache.Options{ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {Label: team}}},
			func(b *dispatch.Builder) *dispatch.Builder { return b.Owns(&corev1.ConfigMap{}).Owns(&corev1.Secret{}) },
			"give the kinds Deployment owns different label selectors"},
		{"children in another namespace", cache.Options{
			DefaultNamespaces: map[string]cache.Config{"a": {}},
			ByObject:          map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{"b": {}}}},
		}, func(b *dispatch.Builder) *dispatch.Builder { return b.Owns(&corev1.ConfigMap{}) },
			`keep ConfigMap to namespace "b" and the controller to "a"`},
		{"a namespace said twice, differently", cache.Options{DefaultNamespaces: map[string]cache.Config{"a": {}}},
			func(b *dispatch.Builder) *dispatch.Builder {
				return b.WithDispatchOptions(dispatch.Options{Namespace: "b"})
			}, `WithDispatchOptions Namespace "b" and the manager's cache options "a" disagree`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mgr, err := managerWithCache(config, c.options)
			if err != nil {
				t.Fatal(err)
			}
			b := c.builder(dispatch.ControllerManagedBy(mgr).For(&appsv1.Deployment{}))
			err = b.Complete(reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return reconcile.Result{}, nil }))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Build: %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// The namespace and label selector of the manager's cache options (a WATCH_NAMESPACE
// operator's) are served by the dispatchers: only the labelled ConfigMaps of that namespace
// are reconciled, with no WithDispatchOptions saying so.
func TestTheManagersCacheNamespaceAndSelectorAreServed(t *testing.T) {
	s := newScene(t, 1, 3)
	outside := tiertest.Namespace(t, s.clientset)
	create(t, s.clientset, outside, 2)
	unlabelled := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "unlabelled"}, Data: map[string]string{"value": "0"}}
	if _, err := s.clientset.CoreV1().ConfigMaps(s.tier.Namespace).Create(context.Background(), unlabelled, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mgr, err := managerWithCache(s.config, cache.Options{
		DefaultNamespaces:    map[string]cache.Config{s.tier.Namespace: {}},
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{"test": "go-sdk"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	log := newLog()
	plaintext := dispatch.Credentials{}
	err = dispatch.ControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		Named("cache-scoped").
		WithOptions(controller.Options{SkipNameValidation: new(true)}).
		WithDispatchOptions(dispatch.Options{LoadBalancer: s.tier.LoadBalancer.Listen, Credentials: &plaintext}).
		Complete(&hasher{inner: &example.Reconciler{Client: mgr.GetClient()}, replica: "go-0", log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the manager did not stop within 30 s")
		}
	}()
	// The objects outside the scope were written first: a controller watching all of them
	// would be told of them with (or before) those inside.
	s.converged(t)
	log.mu.Lock()
	defer log.mu.Unlock()
	for key := range log.byKey {
		if !strings.HasPrefix(key, s.tier.Namespace+"/cm-") {
			t.Errorf("reconciled %s, outside namespace %s and selector test=go-sdk", key, s.tier.Namespace)
		}
	}
	if len(log.byKey) != 3 {
		t.Errorf("reconciled %d keys, want the 3 in scope: %v", len(log.byKey), log.byKey)
	}
}
