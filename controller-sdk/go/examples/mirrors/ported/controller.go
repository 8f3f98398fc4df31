// Package mirrors is the Mirror controller, as a kubebuilder project writes it: a Mirror holds
// a finalizer, marks the ConfigMap it names as mirrored by it, records a hash of its data in
// its status with an event, follows the ConfigMap's changes through a field index and a map
// function, and on deletion unmarks the ConfigMap before it lets the Mirror go.
package mirrors

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	v1 "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/mirrors/api/v1"
)

const (
	// releaseFinalizer holds a Mirror until its ConfigMap is unmarked.
	releaseFinalizer = "examples.kube-dispatch.dev/release"
	// MirroredBy marks a ConfigMap with the Mirror that records it.
	MirroredBy = "examples.kube-dispatch.dev/mirrored-by"
	// configMapKey indexes Mirrors by the ConfigMap they name.
	configMapKey = ".spec.configMapName"
)

// MirrorReconciler keeps each Mirror's record of its ConfigMap.
type MirrorReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder events.EventRecorder
}

// Reconcile records the named ConfigMap in the Mirror, or releases it once the Mirror is
// deleted.
func (r *MirrorReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var mirror v1.Mirror
	if err := r.Get(ctx, req.NamespacedName, &mirror); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !mirror.DeletionTimestamp.IsZero() {
		if !controllerutil.ContainsFinalizer(&mirror, releaseFinalizer) {
			return ctrl.Result{}, nil
		}
		if err := r.release(ctx, &mirror); err != nil {
			return ctrl.Result{}, err
		}
		r.Recorder.Eventf(&mirror, nil, corev1.EventTypeNormal, "Released", "Release", "unmarked ConfigMap %s", mirror.Spec.ConfigMapName)
		controllerutil.RemoveFinalizer(&mirror, releaseFinalizer)
		return ctrl.Result{}, r.Update(ctx, &mirror)
	}
	if controllerutil.AddFinalizer(&mirror, releaseFinalizer) {
		if err := r.Update(ctx, &mirror); err != nil {
			return ctrl.Result{}, err
		}
	}
	var source corev1.ConfigMap
	if err := r.Get(ctx, client.ObjectKey{Namespace: mirror.Namespace, Name: mirror.Spec.ConfigMapName}, &source); err != nil {
		if apierrors.IsNotFound(err) {
			r.Recorder.Eventf(&mirror, nil, corev1.EventTypeWarning, "ConfigMapMissing", "Mirror", "no ConfigMap %s", mirror.Spec.ConfigMapName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if source.Annotations[MirroredBy] != mirror.Name {
		patch := client.MergeFrom(source.DeepCopy())
		metav1.SetMetaDataAnnotation(&source.ObjectMeta, MirroredBy, mirror.Name)
		if err := r.Patch(ctx, &source, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	hash := DataHash(source.Data)
	if mirror.Status.DataHash != hash || mirror.Status.ObservedGeneration != mirror.Generation {
		mirror.Status.DataHash, mirror.Status.ObservedGeneration = hash, mirror.Generation
		if err := r.Status().Update(ctx, &mirror); err != nil {
			return ctrl.Result{}, err
		}
		r.Recorder.Eventf(&mirror, &source, corev1.EventTypeNormal, "Mirrored", "Mirror", "ConfigMap %s at %s", source.Name, hash)
	}
	return ctrl.Result{}, nil
}

// release unmarks the Mirror's ConfigMap, if it is still marked as the Mirror's.
func (r *MirrorReconciler) release(ctx context.Context, mirror *v1.Mirror) error {
	var source corev1.ConfigMap
	if err := r.Get(ctx, client.ObjectKey{Namespace: mirror.Namespace, Name: mirror.Spec.ConfigMapName}, &source); err != nil {
		return client.IgnoreNotFound(err)
	}
	if source.Annotations[MirroredBy] != mirror.Name {
		return nil
	}
	patch := client.MergeFrom(source.DeepCopy())
	delete(source.Annotations, MirroredBy)
	return r.Patch(ctx, &source, patch)
}

// DataHash is the hex SHA-256 of data's keys and values, in key order.
func DataHash(data map[string]string) string {
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		h.Write([]byte(k + "\x00" + data[k] + "\x00"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// mirrorsOf are the Mirrors that name object, a ConfigMap.
func (r *MirrorReconciler) mirrorsOf(ctx context.Context, object client.Object) []reconcile.Request {
	var mirrors v1.MirrorList
	if err := r.List(ctx, &mirrors, client.InNamespace(object.GetNamespace()), client.MatchingFields{configMapKey: object.GetName()}); err != nil {
		return nil
	}
	requests := make([]reconcile.Request, 0, len(mirrors.Items))
	for _, m := range mirrors.Items {
		requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&m)})
	}
	return requests
}

// SetupWithManager indexes the Mirrors by ConfigMap and runs the controller in mgr.
func (r *MirrorReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1.Mirror{}, configMapKey, func(object client.Object) []string {
		return []string{object.(*v1.Mirror).Spec.ConfigMapName}
	}); err != nil {
		return err
	}
	return dispatch.ControllerManagedBy(mgr).
		For(&v1.Mirror{}).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.mirrorsOf)).
		References(&corev1.ConfigMap{}, "spec.configMapName").
		Complete(r)
}
