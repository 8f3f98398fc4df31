package engine

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func named(ns, name string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
}

// Keys wait while no session is open, go out sorted and once, and past the bound become one
// trigger of every key; a request without a name names nothing.
func TestTriggersWaitForASessionAndStayBounded(t *testing.T) {
	tr := NewTriggers(RequestKey("", "ConfigMap"))
	tr.add(named("ns", "b"))
	tr.add(named("ns", "a"))
	tr.add(named("ns", "a"))
	tr.add(named("ns", ""))
	if keys, all, to := tr.take(); keys != nil || all || to != nil {
		t.Fatal("sent with no session open")
	}
	s := testSession()
	tr.sessionOpened(s)
	keys, all, to := tr.take()
	if !slices.Equal(keys, []string{"/ConfigMap/ns/a", "/ConfigMap/ns/b"}) || all || len(to) != 1 {
		t.Fatalf("keys %v, all %v, to %d sessions", keys, all, len(to))
	}
	if keys, _, _ := tr.take(); keys != nil {
		t.Fatalf("sent twice: %v", keys)
	}
	for i := range maxTriggerKeys + 1 {
		tr.add(named("ns", fmt.Sprintf("o-%d", i)))
	}
	keys, all, _ = tr.take()
	if len(keys) != 0 || !all {
		t.Fatalf("past the bound: %d keys, all %v", len(keys), all)
	}
	tr.sessionClosed(s)
	tr.addAll()
	if _, all, to := tr.take(); all || to != nil {
		t.Fatal("sent after the session closed")
	}
}

// The keys a replica names in its triggers are the dispatchers' keys: every key of the ring
// vectors both SDKs and the dispatchers share (proto/testdata/ring_vectors.json, cluster-scoped
// and grouped kinds among them) is rebuilt exactly from its parts.
func TestTriggerKeysAreTheSharedKeys(t *testing.T) {
	raw, err := os.ReadFile("../../../../proto/testdata/ring_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors struct {
		Hashes map[string]string `json:"hashes"`
	}
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatal(err)
	}
	if len(vectors.Hashes) < 10 {
		t.Fatalf("only %d keys", len(vectors.Hashes))
	}
	for key := range vectors.Hashes {
		parts := strings.Split(key, "/")
		if len(parts) != 4 {
			t.Fatalf("%q is not group/kind/namespace/name", key)
		}
		if got := RequestKey(parts[0], parts[1])(named(parts[2], parts[3])); got != key {
			t.Errorf("rebuilt %q as %q", key, got)
		}
	}
}
