package dispatch

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// The memo of checked children is written and read as the Rust SDK's is: the cases of
// proto/testdata/checked_vectors.json (made by its gen_checked_vectors.py), which the Rust
// SDK's children tests check too.
func TestCheckedChildrenSharedVectors(t *testing.T) {
	raw, err := os.ReadFile("../../../proto/testdata/checked_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors struct {
		Cases []struct {
			Name     string `json:"name"`
			Desired  string `json:"desired"`
			Children []struct {
				Group           string `json:"group"`
				Kind            string `json:"kind"`
				Namespace       string `json:"namespace"`
				Name            string `json:"name"`
				ResourceVersion string `json:"resource_version"`
			} `json:"children"`
			MemoHex string `json:"memo_hex"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatal(err)
	}
	if len(vectors.Cases) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range vectors.Cases {
		t.Run(c.Name, func(t *testing.T) {
			ctx := deliveredContext(&pb.ReconcileRequest{Object: &pb.ObjectKey{Version: "v1", Kind: "Owner", Namespace: "ns", Name: "o"}})
			checked := CheckedChildren(ctx, c.Desired)
			for _, child := range c.Children {
				object := &unstructured.Unstructured{}
				object.SetGroupVersionKind(schema.GroupVersionKind{Group: child.Group, Version: "v1", Kind: child.Kind})
				object.SetNamespace(child.Namespace)
				object.SetName(child.Name)
				object.SetResourceVersion(child.ResourceVersion)
				if err := checked.Record(runtime.NewScheme(), object); err != nil {
					t.Fatal(err)
				}
			}
			if err := checked.Leave(ctx); err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(Memo(ctx)); got != c.MemoHex {
				t.Fatalf("memo %s, want %s", got, c.MemoHex)
			}
			// The next reconcile reads it back: the children at the versions recorded hold
			// (those with a version that cannot be compared were not recorded), newer ones do
			// not, and nothing holds for another desired state.
			memo, _ := hex.DecodeString(c.MemoHex)
			next := deliveredContext(&pb.ReconcileRequest{Object: &pb.ObjectKey{Version: "v1", Kind: "Owner", Namespace: "ns", Name: "o"}, Memo: memo})
			again, other := CheckedChildren(next, c.Desired), CheckedChildren(next, c.Desired+"'")
			for _, child := range c.Children {
				shown := Child{Group: child.Group, Version: "v1", Kind: child.Kind, Namespace: child.Namespace, Name: child.Name, ResourceVersion: child.ResourceVersion}
				if _, comparable := comparableVersion(child.ResourceVersion); again.Holds(shown) != comparable {
					t.Fatalf("%v held: %v, recorded: %v", shown, again.Holds(shown), comparable)
				}
				// Only in its own namespace: a same-named child elsewhere was never recorded.
				elsewhere := shown
				elsewhere.Namespace += "-other"
				if again.Holds(elsewhere) {
					t.Fatalf("%v held in a namespace never recorded", elsewhere)
				}
				if other.Holds(shown) {
					t.Fatalf("%v held for another desired state", shown)
				}
				shown.ResourceVersion += "0"
				if again.Holds(shown) {
					t.Fatalf("%v held at a version never recorded", shown)
				}
			}
		})
	}
}

// A child shown at an older version than the one recorded holds (the dispatcher has not seen
// the write yet); a newer one does not.
func TestAnOlderVersionOfARecordedChildHolds(t *testing.T) {
	ctx := deliveredContext(&pb.ReconcileRequest{Object: &pb.ObjectKey{Version: "v1", Kind: "Owner", Namespace: "ns", Name: "o"}})
	checked := CheckedChildren(ctx, "d")
	object := &unstructured.Unstructured{}
	object.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"})
	object.SetName("c")
	object.SetResourceVersion("300")
	if err := checked.Record(runtime.NewScheme(), object); err != nil {
		t.Fatal(err)
	}
	if err := checked.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	next := deliveredContext(&pb.ReconcileRequest{Object: &pb.ObjectKey{Version: "v1", Kind: "Owner", Namespace: "ns", Name: "o"}, Memo: Memo(ctx)})
	again := CheckedChildren(next, "d")
	for version, want := range map[string]bool{"299": true, "300": true, "301": false, "0300": false, "": false, "opaque": false} {
		if got := again.Holds(Child{Version: "v1", Kind: "ConfigMap", Name: "c", ResourceVersion: version}); got != want {
			t.Errorf("version %q held: %v, want %v", version, got, want)
		}
	}
}
