package dispatch

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/scrape"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// A delivery without a body that names the version a reconcile here was given is served that
// object again, without a read; another version is read, and a deletion forgets it.
func TestAnObjectGivenAtTheDeliveredVersionIsServedWithoutARead(t *testing.T) {
	stored := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"},
		Data:       map[string]string{"from": "api-server"},
	}
	gets := 0
	c := &deliveredClient{
		Client: fake.NewClientBuilder().WithObjects(stored).WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, object client.Object, options ...client.GetOption) error {
				gets++
				return c.Get(ctx, key, object, options...)
			},
		}).Build(),
		recent: newRecentObjects(DefaultRecentObjectsBytes),
	}
	name := types.NamespacedName{Namespace: "ns", Name: "a"}
	uid := ""
	deliver := func(reason pb.Reason, version string, body string, deleted bool) (*corev1.ConfigMap, error) {
		ctx := deliveredContext(&pb.ReconcileRequest{
			Key:             "/ConfigMap/ns/a",
			Object:          &pb.ObjectKey{Version: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "a"},
			Reason:          reason,
			ResourceVersion: version,
			Uid:             uid,
			ObjectJson:      []byte(body),
			Deleted:         deleted,
		})
		var cm corev1.ConfigMap
		cm.Labels = map[string]string{"stale": "label"}
		return &cm, c.Get(ctx, name, &cm)
	}
	loaded := func(source string) float64 {
		return scrape.Sample(t, "kube_dispatch_objects_loaded_total", map[string]string{"controller": "client-test", "source": source})
	}
	recentBefore, readBefore := loaded("recent"), loaded("read")

	body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"ns","name":"a","uid":"u1","resourceVersion":"7"},"data":{"from":"delivery"}}`
	if cm, err := deliver(pb.Reason_REASON_MODIFIED, "7", body, false); err != nil || cm.Data["from"] != "delivery" {
		t.Fatalf("the body: %+v, %v", cm, err)
	}
	// The reconcile's writes of children come back: the owner again, at the same version.
	cm, err := deliver(pb.Reason_REASON_OWNED, "7", "", false)
	if err != nil || cm.Data["from"] != "delivery" || cm.ResourceVersion != "7" || cm.Labels != nil {
		t.Fatalf("the echo: %+v, %v", cm, err)
	}
	if gets != 0 || loaded("recent")-recentBefore != 1 {
		t.Fatalf("the echo read the API server (%d gets) or was not counted as recent", gets)
	}
	// Another object of the name (another uid) at that version is read.
	uid = "u2"
	if cm, err := deliver(pb.Reason_REASON_OWNED, "7", "", false); err != nil || cm.Data["from"] != "api-server" || gets != 1 {
		t.Fatalf("another uid: %+v, %v, %d gets", cm, err, gets)
	}
	uid = ""
	// A newer version is read, and kept as read.
	cm, err = deliver(pb.Reason_REASON_OWNED, "8", "", false)
	if err != nil || cm.Data["from"] != "api-server" || gets != 2 || loaded("read")-readBefore != 2 {
		t.Fatalf("a newer version: %+v, %v, %d gets", cm, err, gets)
	}
	if _, err := deliver(pb.Reason_REASON_OWNED, cm.ResourceVersion, "", false); err != nil || gets != 2 {
		t.Fatalf("the version read is kept: %v, %d gets", err, gets)
	}
	// A deletion forgets it.
	if _, err := deliver(pb.Reason_REASON_DELETED, "", "", true); err == nil {
		t.Fatal("a deletion reads as NotFound")
	}
	if _, err := deliver(pb.Reason_REASON_OWNED, cm.ResourceVersion, "", false); err != nil || gets != 3 {
		t.Fatalf("after a deletion: %v, %d gets", err, gets)
	}

	// Keeping nothing (NewClientKeeping(0)): every delivery without a body is read.
	c.recent = newRecentObjects(0)
	if _, err := deliver(pb.Reason_REASON_MODIFIED, "7", body, false); err != nil {
		t.Fatal(err)
	}
	if _, err := deliver(pb.Reason_REASON_OWNED, "7", "", false); err != nil || gets != 4 {
		t.Fatalf("keeping nothing: %v, %d gets", err, gets)
	}
}

// What is kept stays within its budget, the newest first.
func TestRecentObjectsStayWithinTheirBudget(t *testing.T) {
	r := newRecentObjects(1000)
	object := make([]byte, 300)
	for i := range 10 {
		r.keep(recentKey{key: fmt.Sprint(i)}, "1", "", object)
		if r.bytes > 1000 {
			t.Fatalf("%d bytes kept of a 1000-byte budget", r.bytes)
		}
	}
	if _, ok := r.get(recentKey{key: "9"}, "1", ""); !ok {
		t.Fatal("the newest is not kept")
	}
	if _, ok := r.get(recentKey{key: "0"}, "1", ""); ok {
		t.Fatal("the oldest is still kept")
	}
	r.keep(recentKey{key: "big"}, "1", "", make([]byte, 1001))
	if _, ok := r.get(recentKey{key: "big"}, "1", ""); ok || r.bytes > 1000 {
		t.Fatalf("an object larger than the budget is kept (%d bytes)", r.bytes)
	}
	r.keep(recentKey{key: "9"}, "2", "", object)
	if _, ok := r.get(recentKey{key: "9"}, "1", ""); ok {
		t.Fatal("a replaced version is still served")
	}
	if r.bytes != 900 {
		t.Fatalf("%d bytes counted for three objects of 300", r.bytes)
	}
}

// One manager's controllers share the client: what one kept is served to another controller,
// or into another Go type, never (a metadata-only Get keeps no spec; a typed one no kind).
func TestKeptObjectsAreTheirControllersAndTheirTypes(t *testing.T) {
	r := newRecentObjects(DefaultRecentObjectsBytes)
	typed := recentKey{controller: "a", goType: "*v1.ConfigMap", key: "/ConfigMap/ns/x"}
	r.keep(typed, "7", "u1", []byte(`{}`))
	for _, other := range []recentKey{
		{controller: "b", goType: typed.goType, key: typed.key},
		{controller: "a", goType: "*v1.PartialObjectMetadata", key: typed.key},
	} {
		if _, ok := r.get(other, "7", "u1"); ok {
			t.Fatalf("%+v served what %+v kept", other, typed)
		}
	}
	if _, ok := r.get(typed, "7", "u1"); !ok {
		t.Fatal("not kept")
	}
}
