package dispatch

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	klabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The cache options' selectors are taken as controller-runtime's cache fills them in: a kind
// given labels.Everything() is exempt from the default selector (its children are not
// narrowed), a namespace's own Config goes first, and an owned kind in the namespace
// WithDispatchOptions names is served there.
func TestCacheOptionsSelectorsAreTakenAsControllerRuntimeFillsThemIn(t *testing.T) {
	team := klabels.SelectorFromSet(klabels.Set{"team": "a"})
	deployments := appsv1.SchemeGroupVersion.WithKind("Deployment")
	secrets := corev1.SchemeGroupVersion.WithKind("Secret")
	narrow := func(options cache.Options, o Options) (Options, error) {
		t.Helper()
		s, err := newCacheScope(options, scheme.Scheme)
		if err != nil {
			t.Fatal(err)
		}
		return s.narrow(o, deployments, []schema.GroupVersionKind{secrets})
	}
	got, err := narrow(cache.Options{
		DefaultLabelSelector: team,
		ByObject:             map[client.Object]cache.ByObject{&corev1.Secret{}: {Label: klabels.Everything()}},
	}, Options{})
	if err != nil || got.LabelSelector != "team=a" || got.OwnedLabelSelector != "" {
		t.Errorf("Everything() on the owned kind: %+v %v, want the Deployments narrowed, the Secrets not", got, err)
	}
	got, err = narrow(cache.Options{
		DefaultNamespaces:    map[string]cache.Config{"ns": {LabelSelector: klabels.Everything()}},
		DefaultLabelSelector: team,
	}, Options{})
	if err != nil || got.Namespace != "ns" || got.LabelSelector != "" {
		t.Errorf("a namespace's own selector: %+v %v, want namespace ns and no selector", got, err)
	}
	got, err = narrow(cache.Options{
		ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {Namespaces: map[string]cache.Config{"ns": {}}}},
	}, Options{Namespace: "ns"})
	if err != nil || got.Namespace != "ns" {
		t.Errorf("an owned kind in the namespace WithDispatchOptions names: %+v %v", got, err)
	}
	_, err = narrow(cache.Options{DefaultLabelSelector: klabels.Nothing()}, Options{})
	if err == nil || !strings.Contains(err.Error(), "selects nothing") {
		t.Errorf("a selector of nothing: %v", err)
	}
}
