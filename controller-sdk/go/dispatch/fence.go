package dispatch

import "time"

// maxPollWait is the longest a poll asks the dispatcher to hold it; well under any sane ttl.
const maxPollWait = 5 * time.Second

// fence holds the deadlines a replica keeps for one session on its own clock, so that every
// reconcile of the session stops before the dispatcher could hand its key to another replica
// (CONTRACT.md, section 3.3).
//
// Every deadline counts from when a call was sent, plus the time the dispatcher reports it
// held a long poll (PollResponse.held): never later than the dispatcher's own start, whatever
// the call's latency. For a session of ttl t and maximum reconcile time m, the session counts
// as lost 3/4 t after its latest renewal (the dispatcher expires it at t at the earliest), and
// a reconcile is cancelled 9/10 m after its delivery (the dispatcher voids it at m). The rules
// are the Rust SDK's (controller-sdk/src/fence.rs); both are checked against
// proto/testdata/fence_vectors.json.
type fence struct {
	ttl          time.Duration
	maxReconcile time.Duration
	// renewed is the latest instant at which the dispatcher renewed the session, or later.
	renewed time.Time
}

// newFence is the fence of a session opened by a call sent at sent, with the ttl and maximum
// reconcile time the dispatcher granted.
func newFence(ttl, maxReconcile time.Duration, sent time.Time) fence {
	return fence{ttl: ttl, maxReconcile: maxReconcile, renewed: sent}
}

// lostAt is the instant from which the session counts as lost, unless renewed before.
func (f *fence) lostAt() time.Time {
	return f.renewed.Add(f.ttl * 3 / 4)
}

// renew records that a call sent at sent was answered after the dispatcher held it for held
// (zero for a call it answers at once). It returns the instant from which the requests that
// call delivered count their deadlines. An older call answered late never moves the fence back.
func (f *fence) renew(sent time.Time, held time.Duration) time.Time {
	at := sent.Add(held)
	if at.After(f.renewed) {
		f.renewed = at
	}
	return at
}

// reconcileLimit is how long a delivery may take, counted from its delivery.
func (f *fence) reconcileLimit() time.Duration {
	return f.maxReconcile - f.maxReconcile/10
}

// reconcileDeadline is the instant by which a reconcile delivered at delivered must end.
func (f *fence) reconcileDeadline(delivered time.Time) time.Time {
	return delivered.Add(f.reconcileLimit())
}

// pollWait is how often an idle or draining session renews, and the longest a poll asks to
// wait: a quarter of the ttl at most.
func (f *fence) pollWait() time.Duration {
	return min(maxPollWait, f.ttl/4)
}

// waitAt is how long the next call may wait at now when the last call took roundTrip: at most
// pollWait, and short enough that the call after the wait is answered before the fence. At
// least a millisecond (a poll's wait must be positive).
func (f *fence) waitAt(now time.Time, roundTrip time.Duration) time.Duration {
	spare := max(f.lostAt().Sub(now)-roundTrip, 0)
	return max(time.Millisecond, min(f.pollWait(), spare/2))
}
