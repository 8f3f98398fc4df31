// The ConfigMap hasher on the kube-dispatch tier, in Go: keeps an annotation on every
// ConfigMap (of KD_WATCH_NAMESPACE, or of every namespace) equal to a hash of its data
// (package hasher). A controller-runtime Reconciler as any other; only the manager's client and
// the builder come from the SDK. Run as many replicas as you like: the dispatchers share the
// ConfigMaps among them, and a replica that dies is replaced by the others within the session
// ttl.
//
//	KD_LOADBALANCER=127.0.0.1:7071 KD_INSECURE=1 KD_ALLOW_ANONYMOUS=1 go run ./examples/configmap-hasher
package main

import (
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/configmap-hasher/hasher"
)

func main() {
	ctrl.SetLogger(zap.New())
	// A graceful stop waits for running reconciles: at least the dispatcher's maximum
	// reconcile time (60 s by default).
	shutdown := 60 * time.Second
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		NewClient:               dispatch.NewClient,
		GracefulShutdownTimeout: &shutdown,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create the manager:", err)
		os.Exit(1)
	}
	err = dispatch.ControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		Named("configmap-hasher-go").
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		WithDispatchOptions(dispatch.Options{Namespace: os.Getenv("KD_WATCH_NAMESPACE")}).
		Complete(&hasher.Reconciler{Client: mgr.GetClient()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create the controller:", err)
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, "manager stopped:", err)
		os.Exit(1)
	}
}
