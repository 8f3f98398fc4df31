// Package hasher is the ConfigMap hasher's Reconciler: it keeps an annotation on every
// ConfigMap equal to a hash of its data. A controller-runtime Reconciler as any other; the
// example's main runs it on the kube-dispatch tier, and the SDK's tests run it there too.
package hasher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Annotation holds the hash of the ConfigMap's data.
const Annotation = "example.kube-dispatch.dev/hash"

// Reconciler hashes ConfigMaps.
type Reconciler struct {
	Client client.Client
}

// Reconcile makes the ConfigMap's annotation the hash of its data.
func (h *Reconciler) Reconcile(ctx context.Context, request reconcile.Request) (reconcile.Result, error) {
	var cm corev1.ConfigMap
	// Served from the delivery (dispatch.NewClient): no read of the API server for the object.
	if err := h.Client.Get(ctx, request.NamespacedName, &cm); err != nil {
		// NotFound: deleted, nothing to clean up.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	want := Hash(cm.Data)
	if cm.Annotations[Annotation] == want {
		return reconcile.Result{}, nil
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[Annotation] = want
	// Update is conditional on the resourceVersion delivered: a ConfigMap changed since is
	// refused with 409, and its own delivery follows.
	if err := h.Client.Update(ctx, &cm); err != nil && !apierrors.IsConflict(err) {
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).V(1).Info("hashed", "hash", want)
	return reconcile.Result{}, nil
}

// Hash is the first 16 hex digits of the SHA-256 of the data's "key=value" lines, sorted by key.
func Hash(data map[string]string) string {
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
