package dispatch

import (
	"context"
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Writes that fail when the object changed since the reconcile was given it.
//
// The dispatchers hand a key to one replica of a group at a time, and a replica cancels a
// reconcile's context before its key can go to another replica (a session it could not renew,
// a reconcile past its time limit). So no two reconciles of one key run at once. But a
// cancelled reconcile may already have sent a write that the API server applies afterwards,
// while the key's next reconcile, elsewhere, runs: cancelling a context does not recall a
// request in flight.
//
// A write made against the resourceVersion of the object the reconcile was delivered closes
// that gap for the object itself: if anything changed the object since (the next reconcile's
// own write above all), the API server refuses the stale write with 409 Conflict. In
// controller-runtime, Update always carries the object's resourceVersion, and a Patch does when
// made with IfUnchanged. NewClient's first Get of the delivered object returns it at the
// version delivered, so those writes are conditional on the delivery. A Reconciler treats
// IsStale as "a newer reconcile is on it" and returns without an error: the change that made
// the write stale is delivered again.
//
//	base := cm.DeepCopy()
//	cm.Annotations["example/hash"] = hash
//	if err := r.Patch(ctx, cm, dispatch.IfUnchanged(base)); dispatch.IsStale(err) {
//		return reconcile.Result{}, nil
//	} else if err != nil {
//		return reconcile.Result{}, err
//	}
//
// What it does not cover: writes to other objects (children created or applied, deletions)
// carry no precondition on the reconciled object. Make those idempotent (apply the whole
// desired state, delete by name), so that a late one is harmless or undone by the next
// reconcile.

// IfUnchanged is a JSON merge patch of the changes made to an object since base (as
// client.MergeFrom), applied only if the object is still at base's resourceVersion.
func IfUnchanged(base client.Object) client.Patch {
	return client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})
}

// IsStale says a write was refused because the object changed since the resourceVersion it
// was made against (409 Conflict): a newer delivery of the key takes it from there. A
// server-side apply refused for fields another manager owns is a 409 too, but not stale: it
// fails the same way however often it is retried, so it is not one of these.
func IsStale(err error) bool {
	if !apierrors.IsConflict(err) {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if details := status.Status().Details; details != nil {
			for _, cause := range details.Causes {
				if cause.Type == metav1.CauseTypeFieldManagerConflict {
					return false
				}
			}
		}
	}
	return true
}

// countStale counts a write of the delivered object, by its reconcile, that the API server
// refused as stale (kube_dispatch_stale_writes_total), and returns err.
func countStale(ctx context.Context, object client.Object, err error) error {
	if IsStale(err) {
		if d := deliveryFrom(ctx); d != nil && d.Name == client.ObjectKeyFromObject(object) {
			d.Metrics.StaleWrite()
		}
	}
	return err
}
