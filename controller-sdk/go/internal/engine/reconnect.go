package engine

import (
	"math/rand/v2"
	"time"
)

// Reconnects paces one loop's reconnect attempts, as the Rust SDK does: 100 ms doubling to
// 30 s while attempts fail, each with a random jitter of up to as much again (so at most a
// minute), and from 100 ms again after an attempt that worked (a session opened, an assignment
// received), so a long-lived replica follows its tenth dispatcher restart as fast as its first.
type Reconnects struct {
	failures int
}

func (r *Reconnects) Next(worked bool) time.Duration {
	if worked {
		r.failures = 0
	}
	delay := 100 * time.Millisecond << min(r.failures, 9)
	delay = min(delay, 30*time.Second)
	r.failures++
	return delay + rand.N(delay+1)
}
