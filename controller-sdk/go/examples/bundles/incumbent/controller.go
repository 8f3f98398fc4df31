// Package bundles is the Bundle controller, as a kubebuilder project writes it: it finds the
// ConfigMaps it owns through a field index, creates, updates and deletes them to match the
// Bundle, reports how many are ready in the Bundle's status, and checks again every minute.
package bundles

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/bundles/api/v1"
)

// copyOwnerKey indexes ConfigMaps by the name of the Bundle that controls them.
const copyOwnerKey = ".metadata.controller"

// BundleReconciler keeps each Bundle's copies.
type BundleReconciler struct {
	client.Client
	Scheme *runtime.Scheme
}

// Reconcile makes the Bundle's copies what it asks for and reports them in its status.
func (r *BundleReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	var bundle v1.Bundle
	if err := r.Get(ctx, req.NamespacedName, &bundle); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var copies corev1.ConfigMapList
	if err := r.List(ctx, &copies, client.InNamespace(req.Namespace), client.MatchingFields{copyOwnerKey: req.Name}); err != nil {
		return ctrl.Result{}, err
	}
	wanted := map[string]bool{}
	for i := range bundle.Spec.Copies {
		wanted[fmt.Sprintf("%s-%d", bundle.Name, i)] = true
	}
	var ready int32
	for i := range copies.Items {
		copy := &copies.Items[i]
		if !wanted[copy.Name] {
			if err := r.Delete(ctx, copy); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
			continue
		}
		delete(wanted, copy.Name)
		if !maps.Equal(copy.Data, bundle.Spec.Data) {
			copy.Data = bundle.Spec.Data
			if err := r.Update(ctx, copy); err != nil {
				return ctrl.Result{}, err
			}
		}
		ready++
	}
	for name := range wanted {
		copy := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: bundle.Namespace, Name: name}, Data: bundle.Spec.Data}
		if err := controllerutil.SetControllerReference(&bundle, copy, r.Scheme); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.Create(ctx, copy); err != nil {
			return ctrl.Result{}, err
		}
		logger.Info("created a copy", "configmap", name)
		ready++
	}
	if bundle.Status.ReadyCopies != ready || bundle.Status.ObservedGeneration != bundle.Generation {
		bundle.Status.ReadyCopies = ready
		bundle.Status.ObservedGeneration = bundle.Generation
		if err := r.Status().Update(ctx, &bundle); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: time.Minute}, nil
}

// SetupWithManager indexes the copies by owner and runs the controller in mgr.
func (r *BundleReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.ConfigMap{}, copyOwnerKey, func(object client.Object) []string {
		owner := metav1.GetControllerOf(object)
		if owner == nil || owner.APIVersion != v1.GroupVersion.String() || owner.Kind != "Bundle" {
			return nil
		}
		return []string{owner.Name}
	}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1.Bundle{}).
		Owns(&corev1.ConfigMap{}).
		Complete(r)
}
