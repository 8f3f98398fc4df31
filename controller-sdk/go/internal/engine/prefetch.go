package engine

import "time"

// pace decides how many deliveries a poll asks for beyond the free workers: up to most, while
// the replica's reconciles are quick, and none otherwise.
//
// A poll that asks for no more than the free workers leaves every worker that frees idle for a
// round trip to the dispatcher: with one worker and a round trip of a millisecond a replica
// runs at most a thousand reconciles a second however little each costs. Deliveries asked for
// ahead wait in the queue for a worker instead, their deadline running, and a key waiting here
// is one no other replica can take; so more is asked for only while every reconcile of the
// last full window (twice the workers) and of the current one held its worker for at most an
// eighth of the reconcile limit divided by the sessions polling. A slow reconcile, or a
// delivery whose deadline passed (waiting or running), turns it off until the window it ended
// in and one more full window of quick ones have passed.
//
// The sessions poll at once, one per dispatcher, and each asks for the free workers and the
// prefetch less what already waits, so when their answers arrive together up to sessions ×
// (workers + prefetch) deliveries are here: with the prefetch at the workers a delivery waits
// behind at most 2 × sessions − 1 reconciles per worker, each within limit / (8 × sessions),
// under a quarter of its limit however many dispatchers the replica polls. What is weighed is
// how long a worker was held: a delivery refused at once, or a reconcile fenced, counts as
// what it took.
type pace struct {
	most, window int
	// ended and slowest are the current window's; before is the last full window's slowest,
	// valid once full.
	ended   int
	slowest time.Duration
	before  time.Duration
	full    bool
}

func newPace(most, workers int) pace {
	return pace{most: max(most, 0), window: max(2*workers, 1)}
}

// reconciled records a reconcile (or a delivery given up) that took took.
func (p *pace) reconciled(took time.Duration) {
	p.ended++
	p.slowest = max(p.slowest, took)
	if p.ended >= p.window {
		p.before, p.full = p.slowest, true
		p.ended, p.slowest = 0, 0
	}
}

// ahead is how many deliveries may wait for a worker, reconciles being allowed limit each and
// sessions polling at once.
func (p *pace) ahead(limit time.Duration, sessions int) int {
	if p.full && max(p.before, p.slowest) <= limit/time.Duration(8*max(sessions, 1)) {
		return p.most
	}
	return 0
}
