package engine

import (
	"math/rand/v2"
	"strconv"
	"time"

	"google.golang.org/grpc/metadata"
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

// retryPushback is the metadata key of gRPC's pushback (gRFC A6), as the Rust SDK names it
// (kube_dispatch_proto::RETRY_PUSHBACK): the milliseconds a refused caller should wait. A
// dispatcher sets it on an OpenSession refused because too many were being opened at once.
const retryPushback = "grpc-retry-pushback-ms"

// pushback is the pause a dispatcher asked for in the trailer of a refused call, with a random
// jitter of up to as much again, so the replicas it refused do not all come back at once; at
// most 30 s before the jitter. ok is false when it asked for none.
func pushback(trailer metadata.MD) (wait time.Duration, ok bool) {
	values := trailer.Get(retryPushback)
	if len(values) == 0 {
		return 0, false
	}
	millis, err := strconv.ParseUint(values[0], 10, 32)
	if err != nil {
		return 0, false
	}
	hint := min(time.Duration(millis)*time.Millisecond, 30*time.Second)
	return hint + rand.N(hint+1), true
}

// pushedBackError is a refusal whose dispatcher said how long to wait before asking again.
type pushedBackError struct {
	err  error
	wait time.Duration
}

func (e *pushedBackError) Error() string { return e.err.Error() }

func (e *pushedBackError) Unwrap() error { return e.err }
