// Package dispatch runs controller-runtime Reconcilers, unchanged, on the kube-dispatch tier:
// the dispatchers watch the API server and hand each key to one replica of a controller group at
// a time over gRPC long polls, so a controller needs no informer cache and no leader election,
// and every replica works.
//
// The entry points are [ControllerManagedBy], which takes the builder calls controller-runtime's
// builder takes; [NewClient], the manager's client, which reads from the API server and
// serves a reconcile's read of its own object from its delivery; and [NewCache], the manager's
// cache, which keeps nothing and serves field indexes (IndexField, then List with
// client.MatchingFields) with one LIST of a namespace:
//
//	mgr, err := ctrl.NewManager(cfg, ctrl.Options{NewClient: dispatch.NewClient, NewCache: dispatch.NewCache})
//	err = dispatch.ControllerManagedBy(mgr).
//		For(&corev1.ConfigMap{}).
//		Owns(&corev1.Secret{}).
//		Complete(reconciler)
//
// Within a reconcile, [Children] lists the children the dispatcher knows of the delivered owner,
// [CheckedChildren] skips the writes of children already as wanted, and [Memo] and [LeaveMemo]
// carry a note from one reconcile of a key to the next.
//
// The engine behind the builder is internal/engine: one session per dispatcher the load
// balancer assigns (targets.go here picks them; engine.Sessions serves each), each renewed
// within its fence (internal/fence), and the work queue controller-runtime's workers read
// (engine.Queue), whose Get is a delivery and whose Done is its acknowledgement; sessions on
// dispatchers found dead are reported ended (engine.Endings). The wire contract is the Rust
// SDK's; both are checked against the shared vectors in proto/testdata.
package dispatch
