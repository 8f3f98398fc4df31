package engine

import (
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
)

// A refusal's pushback is waited with a random jitter of up to as much again; a trailer without
// one, or with one that is not a number, asks for nothing.
func TestAPushbackIsWaitedWithUpToAsMuchAgain(t *testing.T) {
	if _, ok := pushback(metadata.MD{}); ok {
		t.Error("no hint, yet a pushback")
	}
	if _, ok := pushback(metadata.Pairs(retryPushback, "soon")); ok {
		t.Error("not a number, yet a pushback")
	}
	seen := map[time.Duration]bool{}
	for range 50 {
		wait, ok := pushback(metadata.Pairs(retryPushback, "500"))
		if !ok || wait < 500*time.Millisecond || wait > time.Second {
			t.Fatalf("pushback of 500 ms: %v, %v", wait, ok)
		}
		seen[wait] = true
	}
	if len(seen) < 2 {
		t.Errorf("not jittered: %v", seen)
	}
}
