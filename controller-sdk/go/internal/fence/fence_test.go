package fence

import (
	"encoding/json"
	"os"
	"testing"
	"time"
)

// The cases every controller SDK is checked against (proto/testdata/fence_vectors.json, made by
// its gen_fence_vectors.py): the same deadlines as the Rust SDK's.
func TestFenceSharedVectors(t *testing.T) {
	raw, err := os.ReadFile("../../../../proto/testdata/fence_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors struct {
		Cases []struct {
			Name         string `json:"name"`
			TTL          int64  `json:"ttl_ns"`
			MaxReconcile int64  `json:"max_reconcile_ns"`
			Now          int64  `json:"now_ns"`
			RoundTrip    int64  `json:"round_trip_ns"`
			Renewals     []struct {
				Sent int64 `json:"sent_ns"`
				Held int64 `json:"held_ns"`
			} `json:"renewals"`
			Expect struct {
				LostAt            int64 `json:"lost_at_ns"`
				ReconcileLimit    int64 `json:"reconcile_limit_ns"`
				LastDelivered     int64 `json:"last_delivered_ns"`
				ReconcileDeadline int64 `json:"reconcile_deadline_ns"`
				PollWait          int64 `json:"poll_wait_ns"`
				Wait              int64 `json:"wait_ns"`
			} `json:"expect"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatal(err)
	}
	if len(vectors.Cases) < 8 {
		t.Fatalf("only %d cases", len(vectors.Cases))
	}
	zero := time.Unix(1_000_000, 0)
	at := func(ns int64) time.Time { return zero.Add(time.Duration(ns)) }
	for _, c := range vectors.Cases {
		t.Run(c.Name, func(t *testing.T) {
			f := New(time.Duration(c.TTL), time.Duration(c.MaxReconcile), zero)
			delivered := zero
			for _, r := range c.Renewals {
				delivered = f.Renew(at(r.Sent), time.Duration(r.Held))
			}
			check := func(what string, got, want time.Time) {
				t.Helper()
				if !got.Equal(want) {
					t.Errorf("%s: got %v, want %v", what, got.Sub(zero), want.Sub(zero))
				}
			}
			check("lost at", f.LostAt(), at(c.Expect.LostAt))
			check("last delivered", delivered, at(c.Expect.LastDelivered))
			check("reconcile deadline", f.ReconcileDeadline(delivered), at(c.Expect.ReconcileDeadline))
			if got := f.ReconcileLimit(); got != time.Duration(c.Expect.ReconcileLimit) {
				t.Errorf("reconcile limit: got %v", got)
			}
			if got := f.PollWait(); got != time.Duration(c.Expect.PollWait) {
				t.Errorf("poll wait: got %v", got)
			}
			if got := f.WaitAt(at(c.Now), time.Duration(c.RoundTrip)); got != time.Duration(c.Expect.Wait) {
				t.Errorf("wait: got %v, want %v", got, time.Duration(c.Expect.Wait))
			}
		})
	}
}
