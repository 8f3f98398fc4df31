package bundles

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatchtest"
	v1 "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/bundles/api/v1"
)

// k8sClient reads and writes as the tests' user, beside the controller.
var k8sClient client.Client

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" && os.Getenv("KD_REQUIRE_CLUSTER") == "" {
		fmt.Println("skipped: KUBEBUILDER_ASSETS names no API server binaries (setup-envtest use prints them)")
		return
	}
	testEnv := &dispatchtest.Environment{Environment: envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "config", "crd")}, ErrorIfCRDPathMissing: true}}
	cfg, err := testEnv.Start()
	must(err)
	must(v1.AddToScheme(scheme.Scheme))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, NewClient: dispatch.NewClient, NewCache: dispatch.NewCache})
	must(err)
	must((&BundleReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme()}).SetupWithManager(mgr))
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme.Scheme})
	must(err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	must(<-stopped)
	must(testEnv.Stop())
	os.Exit(code)
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// eventually waits up to 30 s for check to pass, failing with its last complaint.
func eventually(t *testing.T, check func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// copiesOf checks that the namespace holds exactly the copies want of bundle, with its data,
// and that its status reports them at its generation.
func copiesOf(ctx context.Context, namespace, bundle string, want int32, data map[string]string) func() error {
	return func() error {
		var b v1.Bundle
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: bundle}, &b); err != nil {
			return err
		}
		var all corev1.ConfigMapList
		if err := k8sClient.List(ctx, &all, client.InNamespace(namespace)); err != nil {
			return err
		}
		var held int32
		for _, cm := range all.Items {
			if owner := metav1.GetControllerOf(&cm); owner == nil || owner.Name != bundle {
				continue
			}
			if cm.Data["k"] != data["k"] {
				return fmt.Errorf("%s holds %v, not %v", cm.Name, cm.Data, data)
			}
			held++
		}
		if held != want || b.Status.ReadyCopies != want || b.Status.ObservedGeneration != b.Generation {
			return fmt.Errorf("%s: %d copies, status %+v at generation %d; want %d", bundle, held, b.Status, b.Generation, want)
		}
		return nil
	}
}

// A Bundle gets its copies and reports them; scaled down and changed, the extra copies go and
// the others take the new data; a second Bundle in the namespace keeps its own.
func TestABundleKeepsItsCopies(t *testing.T) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bundles-"}}
	must(k8sClient.Create(ctx, ns))
	first := &v1.Bundle{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "first"}, Spec: v1.BundleSpec{Copies: 3, Data: map[string]string{"k": "one"}}}
	second := &v1.Bundle{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "second"}, Spec: v1.BundleSpec{Copies: 2, Data: map[string]string{"k": "two"}}}
	for _, b := range []*v1.Bundle{first, second} {
		if err := k8sClient.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, copiesOf(ctx, ns.Name, "first", 3, first.Spec.Data))
	eventually(t, copiesOf(ctx, ns.Name, "second", 2, second.Spec.Data))

	changed := map[string]string{"k": "changed"}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(first), first); err != nil {
			return err
		}
		first.Spec.Copies, first.Spec.Data = 1, changed
		return k8sClient.Update(ctx, first)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, copiesOf(ctx, ns.Name, "first", 1, changed))
	eventually(t, copiesOf(ctx, ns.Name, "second", 2, second.Spec.Data))
}
