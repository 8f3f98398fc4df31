package dispatch_test

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/tiertest"
)

// rustAnnotation is where the Rust SDK's example hasher (controller-sdk/examples/
// configmap_hasher.rs) keeps its hash of a ConfigMap's data.
const rustAnnotation = "example.kube-dispatch.dev/content-hash"

// rustHash is that hash: SHA-256 over each key and value, NUL after each, in key order.
func rustHash(data map[string]string) string {
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write([]byte(data[k]))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Two Go replicas of one group and a replica of the Rust SDK's example controller, in a group
// of its own, share one tier: each group reconciles every object and every change (the Rust
// one's annotation and the Go one's both follow the data), and the Go replicas never
// reconcile one key at the same time.
func TestGoAndRustReplicasServeTheirGroupsOnOneTier(t *testing.T) {
	s := newScene(t, 2, 20)
	rust := s.tier.Run("rust-hasher", "examples/configmap_hasher",
		"KUBECONFIG="+tiertest.Kubeconfig(),
		"KD_LOADBALANCER="+s.tier.LoadBalancer.Listen,
		"KD_WATCH_NAMESPACE="+s.tier.Namespace,
		"KD_INSECURE=1", "KD_ALLOW_ANONYMOUS=1",
		"POD_NAME=rust-0",
		"RUST_LOG=warn",
	)
	log := newLog()
	replica(t, s.config, s.tier, "go-mixed", "go-0", log, 10*time.Millisecond)
	replica(t, s.config, s.tier, "go-mixed", "go-1", log, 10*time.Millisecond)
	rustCurrent := func(cm corev1.ConfigMap) bool { return cm.Annotations[rustAnnotation] == rustHash(cm.Data) }
	converged(t, s.clientset, s.tier.Namespace, s.objects, rustCurrent)
	s.changeAll(t, 2, nil)
	converged(t, s.clientset, s.tier.Namespace, s.objects, rustCurrent)
	if overlaps := log.overlapsNow(); len(overlaps) > 0 {
		t.Fatalf("reconciles of one key overlapped in the Go group: %v (Rust replica's log: %s)", overlaps, rust.Log)
	}
	if replicas := log.replicas(); replicas["go-0"] == 0 || replicas["go-1"] == 0 {
		t.Fatalf("the Go replicas did not share the keys: %v", replicas)
	}
}
