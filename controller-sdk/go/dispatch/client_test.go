package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/scrape"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

func deliveredContext(request *pb.ReconcileRequest) context.Context {
	d := engine.NewDelivery(request, engine.NewMetrics("client-test", "client-test"))
	return context.WithValue(context.Background(), deliveryKey{}, d)
}

// The delivered object is read from its delivery, into a zeroed object; a second read, or one
// of another version or name, goes to the API server.
func TestTheDeliveredObjectIsServedFromItsDeliveryOnce(t *testing.T) {
	stored := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "999"},
		Data:       map[string]string{"from": "api-server"},
	}
	c := &deliveredClient{Client: fake.NewClientBuilder().WithObjects(stored).Build()}
	ctx := deliveredContext(&pb.ReconcileRequest{
		Object:          &pb.ObjectKey{Version: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "a"},
		ResourceVersion: "7",
		ObjectJson:      []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"ns","name":"a","resourceVersion":"7"},"data":{"from":"delivery"}}`),
	})
	var cm corev1.ConfigMap
	cm.Data = map[string]string{"stale": "left over"}
	cm.Labels = map[string]string{"stale": "label"}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "a"}, &cm); err != nil {
		t.Fatal(err)
	}
	if cm.ResourceVersion != "7" || len(cm.Data) != 1 || cm.Data["from"] != "delivery" || cm.Labels != nil {
		t.Fatalf("first read: %+v", cm)
	}
	var again corev1.ConfigMap
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "a"}, &again); err != nil {
		t.Fatal(err)
	}
	if again.Data["from"] != "api-server" {
		t.Fatalf("a second read was served from the delivery: %+v", again)
	}
}

func TestADeletedDeliveryReadsAsNotFound(t *testing.T) {
	c := &deliveredClient{Client: fake.NewClientBuilder().Build()}
	ctx := deliveredContext(&pb.ReconcileRequest{
		Object:  &pb.ObjectKey{Version: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "gone"},
		Deleted: true,
	})
	err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "gone"}, &corev1.ConfigMap{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "configmaps") {
		t.Fatalf("the error names %q, not the resource", err)
	}
}

// A write of a reconcile that the API server refuses as stale is counted, and returned as it
// came; IfUnchanged makes a patch carry the resourceVersion it was made against.
func TestStaleWritesAreCountedAndReturned(t *testing.T) {
	stored := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "8"}}
	var patched []byte
	conflict := apierrors.NewConflict(corev1.Resource("configmaps"), "a", errors.New("the object has been modified"))
	c := &deliveredClient{Client: fake.NewClientBuilder().WithObjects(stored).WithInterceptorFuncs(interceptor.Funcs{
		Update: func(context.Context, client.WithWatch, client.Object, ...client.UpdateOption) error { return conflict },
		Patch: func(_ context.Context, _ client.WithWatch, object client.Object, patch client.Patch, _ ...client.PatchOption) error {
			patched, _ = patch.Data(object)
			return conflict
		},
		SubResourceUpdate: func(context.Context, client.Client, string, client.Object, ...client.SubResourceUpdateOption) error {
			return conflict
		},
	}).Build()}
	ctx := deliveredContext(&pb.ReconcileRequest{Object: &pb.ObjectKey{Version: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "a"}})
	stale := func() float64 {
		return scrape.Sample(t, "kube_dispatch_stale_writes_total", map[string]string{"controller": "client-test"})
	}
	before := stale()

	seen := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "7"}}
	if err := c.Update(ctx, seen.DeepCopy()); !IsStale(err) {
		t.Fatalf("Update: %v", err)
	}
	changed := seen.DeepCopy()
	changed.Labels = map[string]string{"x": "y"}
	if err := c.Patch(ctx, changed, IfUnchanged(seen)); !IsStale(err) {
		t.Fatalf("Patch: %v", err)
	}
	if !strings.Contains(string(patched), `"resourceVersion":"7"`) {
		t.Fatalf("the patch is not conditional on the version seen: %s", patched)
	}
	if err := c.Status().Update(ctx, seen.DeepCopy()); !IsStale(err) {
		t.Fatalf("status Update: %v", err)
	}
	if got := stale() - before; got != 3 {
		t.Fatalf("stale writes counted: %v, want 3", got)
	}
	// Outside a reconcile, or a write of another object (a child), nothing is counted.
	if err := c.Update(context.Background(), seen.DeepCopy()); !IsStale(err) {
		t.Fatalf("Update: %v", err)
	}
	child := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a-child", ResourceVersion: "3"}}
	if err := c.Update(ctx, child); !IsStale(err) {
		t.Fatalf("Update of a child: %v", err)
	}
	if got := stale() - before; got != 3 {
		t.Fatalf("stale writes counted: %v, want 3", got)
	}
}

// A server-side apply refused for fields another manager owns is a 409, but not stale.
func TestAnApplyConflictIsNotStale(t *testing.T) {
	err := apierrors.NewApplyConflict([]metav1.StatusCause{{
		Type: metav1.CauseTypeFieldManagerConflict, Message: `conflict with "kubectl"`, Field: ".data.x",
	}}, "Apply failed with 1 conflict")
	if !apierrors.IsConflict(err) || IsStale(err) {
		t.Fatalf("an apply conflict: IsConflict %v, IsStale %v", apierrors.IsConflict(err), IsStale(err))
	}
}

// After the reconcile's own write of its object, a read of it is what the write answered, with
// no request; the next delivery at that version (the write's change coming back) is served it
// too. A read into another type still goes to the API server.
func TestAReadAfterTheReconcilesOwnWriteIsServedItsAnswer(t *testing.T) {
	stored := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "u1", ResourceVersion: "7"},
		Data:       map[string]string{"v": "1"},
	}
	gets := 0
	c := &deliveredClient{
		Client: fake.NewClientBuilder().WithObjects(stored).WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, object client.Object, options ...client.GetOption) error {
				gets++
				return cl.Get(ctx, key, object, options...)
			},
		}).Build(),
		recent: newRecentObjects(1 << 20),
		fresh:  &freshness{},
	}
	key := types.NamespacedName{Namespace: "ns", Name: "a"}
	objectKey := &pb.ObjectKey{Version: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "a"}
	ctx := deliveredContext(&pb.ReconcileRequest{Key: "/ConfigMap/ns/a", Object: objectKey, ResourceVersion: "7", Uid: "u1"})
	var cm corev1.ConfigMap
	if err := c.Get(ctx, key, &cm); err != nil || gets != 1 {
		t.Fatalf("first read: %v, %d requests", err, gets)
	}
	cm.Data["v"] = "2"
	if err := c.Update(ctx, &cm); err != nil {
		t.Fatal(err)
	}
	written := cm.ResourceVersion
	var again corev1.ConfigMap
	if err := c.Get(ctx, key, &again); err != nil {
		t.Fatal(err)
	}
	if gets != 1 || again.Data["v"] != "2" || again.ResourceVersion != written {
		t.Fatalf("read after the write: %d requests, %+v (written at %s)", gets, again, written)
	}
	var metadata metav1.PartialObjectMetadata
	metadata.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	if err := c.Get(ctx, key, &metadata); err != nil || gets != 2 {
		t.Fatalf("a read into another type: %v, %d requests", err, gets)
	}
	// The write's change, delivered without a body at its version, is served what it answered.
	next := deliveredContext(&pb.ReconcileRequest{Key: "/ConfigMap/ns/a", Object: objectKey, ResourceVersion: written, Uid: "u1"})
	var echoed corev1.ConfigMap
	if err := c.Get(next, key, &echoed); err != nil || gets != 2 || echoed.Data["v"] != "2" {
		t.Fatalf("the write's echo: %v, %d requests, %+v", err, gets, echoed)
	}
}

// floorClient is a client over ConfigMap "a" and ConfigMap "held" (deleted, held by a
// finalizer) whose Lists record their options into listed and answer at version 900, and whose
// applies answer at version 500.
func floorClient(listed *[]*metav1.ListOptions) *deliveredClient {
	stored := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "7"}}
	now := metav1.Now()
	held := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "held", ResourceVersion: "8",
		DeletionTimestamp: &now, Finalizers: []string{"example.com/hold"}}}
	return &deliveredClient{
		Client: fake.NewClientBuilder().WithObjects(stored, held).WithStatusSubresource(stored).WithInterceptorFuncs(interceptor.Funcs{
			List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, options ...client.ListOption) error {
				*listed = append(*listed, (&client.ListOptions{}).ApplyOptions(options).Raw)
				if err := cl.List(ctx, list, options...); err != nil {
					return err
				}
				list.(*corev1.ConfigMapList).ResourceVersion = "900"
				return nil
			},
			Apply: func(_ context.Context, _ client.WithWatch, object runtime.ApplyConfiguration, _ ...client.ApplyOption) error {
				object.(*corev1ac.ConfigMapApplyConfiguration).WithResourceVersion("500")
				return nil
			},
		}).Build(),
		recent: newRecentObjects(1 << 20),
		fresh:  &freshness{},
	}
}

// Every write moves what a List by index must be at least as new as: a status write and a
// server-side apply by the version they answered. A deletion answers none, so the next List by
// index reads the API server consistently (no resourceVersion), and the one after it is again
// at least as new as what that read showed.
func TestEveryWriteMovesTheFloorOfListsByIndex(t *testing.T) {
	var listed []*metav1.ListOptions
	c := floorClient(&listed)
	ctx := deliveredContext(&pb.ReconcileRequest{Key: "/ConfigMap/ns/a", Object: &pb.ObjectKey{Version: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "a"}, ResourceVersion: "7"})
	floor := func() uint64 { return c.fresh.written.Load() }

	var cm corev1.ConfigMap
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "a"}, &cm); err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Update(ctx, &cm); err != nil {
		t.Fatal(err)
	}
	if v, _ := comparableVersion(cm.ResourceVersion); floor() != v || v == 0 {
		t.Fatalf("after a status write at %s the floor is %d", cm.ResourceVersion, floor())
	}
	own := ownKey("/ConfigMap/ns/a", schema.GroupKind{Kind: "ConfigMap"})
	if c.fresh.own.newerThan(own, 0) {
		t.Fatal("a write of an object with no controller was noted as the key's child")
	}
	child := corev1ac.ConfigMap("b", "ns").WithOwnerReferences(metav1ac.OwnerReference().
		WithAPIVersion("v1").WithKind("ConfigMap").WithName("a").WithUID("uid-a").WithController(true))
	if err := c.Apply(ctx, child); err != nil {
		t.Fatal(err)
	}
	if floor() != 500 || !c.fresh.own.newerThan(own, 499) || c.fresh.own.newerThan(own, 500) || c.fresh.own.newerThan(own, 0) {
		t.Fatalf("after a child's apply answered at 500: floor %d", floor())
	}

	byName := []wanted{{field: "x", value: "a", extract: func(o client.Object) []string { return []string{o.GetName()} }}}
	list := func() *corev1.ConfigMapList {
		var l corev1.ConfigMapList
		if err := c.listByIndex(ctx, &l, corev1.SchemeGroupVersion.WithKind("ConfigMap"), &client.ListOptions{Namespace: "ns"}, nil, byName); err != nil {
			t.Fatal(err)
		}
		return &l
	}
	list()
	if raw := listed[len(listed)-1]; raw == nil || raw.ResourceVersion != "500" {
		t.Fatalf("a List before any deletion reads at the floor, 500: %+v", raw)
	}
	if err := c.Delete(ctx, &cm); err != nil {
		t.Fatal(err)
	}
	if l := list(); listed[len(listed)-1] != nil || len(l.Items) != 0 {
		t.Fatalf("the List after a deletion: options %+v, %d items", listed[len(listed)-1], len(l.Items))
	}
	list()
	if raw := listed[len(listed)-1]; raw == nil || raw.ResourceVersion != "900" {
		t.Fatalf("the List after the consistent one reads at least at what it showed, 900: %+v", raw)
	}
	// A deletion of what is already gone counts too; one that failed otherwise does not.
	if err := c.Delete(ctx, &cm); !apierrors.IsNotFound(err) {
		t.Fatalf("deleting it again: %v", err)
	}
	configMaps := deletionScope{kind: schema.GroupKind{Kind: "ConfigMap"}, namespace: "ns"}
	if deleted, _ := c.fresh.deleted.since(configMaps); !deleted {
		t.Fatal("a deletion answered not found reads consistently after")
	}
	// Taking the last finalizer off an object being deleted lets it go: a deletion too.
	list()
	if deleted, _ := c.fresh.deleted.since(configMaps); deleted {
		t.Fatal("the consistent List did not count")
	}
	// A deletion of another kind, or in another namespace, leaves these Lists as they are.
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gone"}}
	if err := c.Delete(ctx, other); !apierrors.IsNotFound(err) {
		t.Fatalf("deleting a Secret: %v", err)
	}
	elsewhere := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "gone"}}
	if err := c.Delete(ctx, elsewhere); !apierrors.IsNotFound(err) {
		t.Fatalf("deleting elsewhere: %v", err)
	}
	if deleted, _ := c.fresh.deleted.since(configMaps); deleted {
		t.Fatal("a deletion of another kind or namespace made the ConfigMaps of ns read consistently")
	}
	var going corev1.ConfigMap
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "held"}, &going); err != nil {
		t.Fatal(err)
	}
	going.Finalizers = nil
	if err := c.Update(ctx, &going); err != nil {
		t.Fatal(err)
	}
	if deleted, _ := c.fresh.deleted.since(configMaps); !deleted {
		t.Fatal("the write that let an object go did not count as a deletion")
	}
}

// The deletions are kept for at most deletionScopesKept kinds and namespaces: one forgotten is
// taken as deleted in again (one consistent List more), never as clean.
func TestForgottenDeletionScopesReadConsistentlyOnce(t *testing.T) {
	var d deletions
	scope := func(i int) deletionScope {
		return deletionScope{kind: schema.GroupKind{Kind: "ConfigMap"}, namespace: fmt.Sprintf("ns-%d", i)}
	}
	for i := range deletionScopesKept + 1 {
		d.noted(scope(i))
	}
	if len(d.by) > deletionScopesKept {
		t.Fatalf("%d scopes kept, at most %d", len(d.by), deletionScopesKept)
	}
	deleted, mark := d.since(scope(0))
	if !deleted {
		t.Fatal("a forgotten scope was taken as clean")
	}
	d.listed(scope(0), mark)
	if deleted, _ := d.since(scope(0)); deleted {
		t.Fatal("a consistent List of the forgotten scope did not count")
	}
}

// A key's own writes are kept for at most ownWritesKept keys, the oldest going first; a key
// not known reads as its requests show it, and one shown is forgotten.
func TestOwnWritesAreBoundedAndForgottenOnceShown(t *testing.T) {
	var w ownWrites
	for i := range ownWritesKept + 1 {
		w.note(fmt.Sprintf("k%d", i), 5)
	}
	if len(w.by) != ownWritesKept || len(w.order) != ownWritesKept {
		t.Fatalf("kept %d keys, %d in order", len(w.by), len(w.order))
	}
	if w.newerThan("k0", 1) {
		t.Fatal("the oldest key was not forgotten")
	}
	// Noted again, k1 is the newest: k2 goes first.
	w.note("k1", 5)
	w.note("k-last", 5)
	if w.newerThan("k2", 1) || !w.newerThan("k1", 4) {
		t.Fatal("a key noted again was not kept as the newest")
	}
	if !w.newerThan("k1", 4) || w.newerThan("k1", 5) || w.newerThan("k1", 1) {
		t.Fatal("a write shown was not forgotten")
	}
	if len(w.by) != ownWritesKept-1 || len(w.order) != ownWritesKept-1 {
		t.Fatalf("after one shown: %d keys, %d in order", len(w.by), len(w.order))
	}
}
