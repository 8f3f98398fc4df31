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
// last full window (twice the workers) and of the current one ended within an eighth of the
// reconcile limit. A slow reconcile, or a delivery that timed out waiting, turns it off until
// the window it ended in and one more full window of quick ones have passed.
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

// ahead is how many deliveries may wait for a worker, reconciles being allowed limit each.
func (p *pace) ahead(limit time.Duration) int {
	if p.full && max(p.before, p.slowest) <= limit/8 {
		return p.most
	}
	return 0
}
