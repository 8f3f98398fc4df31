// Package fence holds the deadlines a replica keeps for one session on its own clock: when the
// session counts as lost, how long a poll may wait, and by when each reconcile must end.
package fence

import "time"

// MaxPollWait is the longest a poll asks the dispatcher to hold it; well under any sane ttl.
const MaxPollWait = 5 * time.Second

// Fence holds the deadlines a replica keeps for one session on its own clock, so that every
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
type Fence struct {
	ttl          time.Duration
	maxReconcile time.Duration
	// renewed is the latest instant at which the dispatcher renewed the session, or later.
	renewed time.Time
}

// New is the fence of a session opened by a call sent at sent, with the ttl and maximum
// reconcile time the dispatcher granted.
func New(ttl, maxReconcile time.Duration, sent time.Time) Fence {
	return Fence{ttl: ttl, maxReconcile: maxReconcile, renewed: sent}
}

// LostAt is the instant from which the session counts as lost, unless renewed before.
func (f *Fence) LostAt() time.Time {
	return f.renewed.Add(f.ttl * 3 / 4)
}

// Renew records that a call sent at sent was answered after the dispatcher held it for held
// (zero for a call it answers at once). It returns the instant from which the requests that
// call delivered count their deadlines. An older call answered late never moves the fence back.
func (f *Fence) Renew(sent time.Time, held time.Duration) time.Time {
	at := sent.Add(held)
	if at.After(f.renewed) {
		f.renewed = at
	}
	return at
}

// ReconcileLimit is how long a delivery may take, counted from its delivery.
func (f *Fence) ReconcileLimit() time.Duration {
	return f.maxReconcile - f.maxReconcile/10
}

// ReconcileDeadline is the instant by which a reconcile delivered at delivered must end.
func (f *Fence) ReconcileDeadline(delivered time.Time) time.Time {
	return delivered.Add(f.ReconcileLimit())
}

// PollWait is how often an idle or draining session renews, and the longest a poll asks to
// wait: a quarter of the ttl at most.
func (f *Fence) PollWait() time.Duration {
	return min(MaxPollWait, f.ttl/4)
}

// WaitAt is how long the next call may wait at now when the last call took roundTrip: at most
// PollWait, and short enough that the call after the wait is answered before the fence. At
// least a millisecond (a poll's wait must be positive).
func (f *Fence) WaitAt(now time.Time, roundTrip time.Duration) time.Duration {
	spare := max(f.LostAt().Sub(now)-roundTrip, 0)
	return max(time.Millisecond, min(f.PollWait(), spare/2))
}
