// The ConfigMap hasher on the kube-dispatch tier, in Go: keeps an annotation on every
// ConfigMap (of KD_WATCH_NAMESPACE, or of every namespace) equal to a hash of its data. A
// controller-runtime Reconciler as any other; only the manager's client and the builder come
// from the SDK. Run as many replicas as you like: the dispatchers share the ConfigMaps among
// them, and a replica that dies is replaced by the others within the session ttl.
//
//	KD_LOADBALANCER=127.0.0.1:7071 KD_INSECURE=1 KD_ALLOW_ANONYMOUS=1 go run ./examples/configmap-hasher
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
)

// annotation holds the hash of the ConfigMap's data.
const annotation = "example.kube-dispatch.dev/hash"

type hasher struct {
	client client.Client
}

func (h *hasher) Reconcile(ctx context.Context, request reconcile.Request) (reconcile.Result, error) {
	var cm corev1.ConfigMap
	// Served from the delivery (NewClient): no read of the API server for the object itself.
	if err := h.client.Get(ctx, request.NamespacedName, &cm); err != nil {
		// NotFound: deleted, nothing to clean up.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	want := hash(cm.Data)
	if cm.Annotations[annotation] == want {
		return reconcile.Result{}, nil
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[annotation] = want
	// Update is conditional on the resourceVersion delivered: a ConfigMap changed since is
	// refused with 409, and its own delivery follows.
	if err := h.client.Update(ctx, &cm); err != nil && !apierrors.IsConflict(err) {
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).Info("hashed", "hash", want)
	return reconcile.Result{}, nil
}

func hash(data map[string]string) string {
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%s=%s\n", k, data[k])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func main() {
	ctrl.SetLogger(zap.New())
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{NewClient: dispatch.NewClient})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create the manager:", err)
		os.Exit(1)
	}
	err = dispatch.ControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		Named("configmap-hasher-go").
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		WithDispatchOptions(dispatch.Options{Namespace: os.Getenv("KD_WATCH_NAMESPACE")}).
		Complete(&hasher{client: mgr.GetClient()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create the controller:", err)
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, "manager stopped:", err)
		os.Exit(1)
	}
}
