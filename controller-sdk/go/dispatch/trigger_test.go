package dispatch

import (
	"fmt"
	"slices"
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
	tr := newTriggers(requestKey("", "ConfigMap"))
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
