package mirrors

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/mirrors/api/v1"
)

// k8sClient reads and writes as the tests' user, beside the controller.
var k8sClient client.Client

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" && os.Getenv("KD_REQUIRE_CLUSTER") == "" {
		fmt.Println("skipped: KUBEBUILDER_ASSETS names no API server binaries (setup-envtest use prints them)")
		return
	}
	testEnv := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "config", "crd")}, ErrorIfCRDPathMissing: true}
	cfg, err := testEnv.Start()
	must(err)
	must(v1.AddToScheme(scheme.Scheme))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	must(err)
	reconciler := &MirrorReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("mirror-controller")}
	must(reconciler.SetupWithManager(mgr))
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

// recorded checks that the Mirror holds the finalizer and the hash of data, and the ConfigMap
// is marked as its.
func recorded(ctx context.Context, namespace string, data map[string]string) func() error {
	return func() error {
		var mirror v1.Mirror
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "mirror"}, &mirror); err != nil {
			return err
		}
		var source corev1.ConfigMap
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "source"}, &source); err != nil {
			return err
		}
		if !slices.Contains(mirror.Finalizers, "examples.kube-dispatch.dev/release") || mirror.Status.DataHash != DataHash(data) ||
			source.Annotations[MirroredBy] != "mirror" {
			return fmt.Errorf("finalizers %v, status %+v, ConfigMap annotations %v", mirror.Finalizers, mirror.Status, source.Annotations)
		}
		return nil
	}
}

// published checks that the controller published an event of reason about the Mirror.
func published(ctx context.Context, namespace, reason string) func() error {
	return func() error {
		var list eventsv1.EventList
		if err := k8sClient.List(ctx, &list, client.InNamespace(namespace)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.Regarding.Name == "mirror" && e.ReportingController == "mirror-controller" {
				return nil
			}
		}
		return fmt.Errorf("no %s event among %d", reason, len(list.Items))
	}
}

// A Mirror holds its finalizer, records its ConfigMap with an event and follows its changes;
// deleted, it unmarks the ConfigMap, says so in an event, and goes.
func TestAMirrorFollowsItsConfigMapAndReleasesIt(t *testing.T) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "mirrors-"}}
	must(k8sClient.Create(ctx, ns))
	source := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "source"}, Data: map[string]string{"k": "one"}}
	mirror := &v1.Mirror{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "mirror"}, Spec: v1.MirrorSpec{ConfigMapName: "source"}}
	if err := k8sClient.Create(ctx, source); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Create(ctx, mirror); err != nil {
		t.Fatal(err)
	}
	eventually(t, recorded(ctx, ns.Name, source.Data))
	eventually(t, published(ctx, ns.Name, "Mirrored"))

	changed := map[string]string{"k": "two"}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(source), source); err != nil {
			return err
		}
		source.Data = changed
		return k8sClient.Update(ctx, source)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, recorded(ctx, ns.Name, changed))

	if err := k8sClient.Delete(ctx, mirror); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(mirror), mirror); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the Mirror is still there (%v), finalizers %v", err, mirror.Finalizers)
		}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(source), source); err != nil {
			return err
		}
		if _, marked := source.Annotations[MirroredBy]; marked {
			return fmt.Errorf("the ConfigMap is still marked: %v", source.Annotations)
		}
		return nil
	})
	eventually(t, published(ctx, ns.Name, "Released"))
}
