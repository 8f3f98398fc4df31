package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// Sessions on dispatchers that died: which this replica held and has ended, which dispatchers
// the live ones name dead, and reporting the first to the second, so the tier takes a dead
// dispatcher's keys over without waiting out its handover bound (dispatcher/HANDOVER.md,
// "Ending the wait for a member that died, by reports").
//
// A live dispatcher names, in each answer, the dispatchers that died whose sessions it waits to
// see ended. A session this replica still holds on one of them is ended at once as lost: what
// it delivered is cancelled, and it counts as ended only once every reconcile has returned.
// While its dispatcher is named dead, an ended session is reported with every poll, and at
// once with an ack of each open session (its full id, which only this replica knows).
//
// Bounds: endingsKept ended sessions (the last per dispatcher) and endingsKept dispatchers named
// dead, each forgotten after endingsKeptFor; a call reports at most reportsPerCall.

const (
	endingsKept    = 64
	endingsKeptFor = 10 * time.Minute
	reportsPerCall = 16
	maxIDBytes     = 256
)

// errNamedDead ends a session whose dispatcher a live dispatcher named dead.
var errNamedDead = errors.New("the other dispatchers found this dispatcher dead: session ended, to be reported so they take its keys over")

type endedSession struct {
	session string
	at      time.Time
}

type openSession struct {
	s    *session
	fail context.CancelCauseFunc
}

// endings is the replica's record of sessions for the takeover of a dead dispatcher.
type endings struct {
	log  logr.Logger
	mu   sync.Mutex
	done map[string]endedSession // per dispatcher id: the last session ended there
	dead map[string]time.Time    // dispatcher ids named dead, when last
	open map[string]openSession  // per dispatcher id
}

func newEndings(log logr.Logger) *endings {
	return &endings{
		log:  log,
		done: map[string]endedSession{},
		dead: map[string]time.Time{},
		open: map[string]openSession{},
	}
}

// opened records session s on dispatcher id; fail ends it (as lost) when id is named dead.
func (e *endings) opened(id string, s *session, fail context.CancelCauseFunc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dead := e.dead[id]; dead {
		fail(errNamedDead)
	}
	e.open[id] = openSession{s: s, fail: fail}
}

// ended records that session on dispatcher id has ended and every reconcile it delivered has
// returned; if id is named dead, the open sessions report it at once.
func (e *endings) ended(id, session string) {
	e.mu.Lock()
	if o, ok := e.open[id]; ok && o.s.id == session {
		delete(e.open, id)
	}
	now := time.Now()
	e.done[id] = endedSession{session: session, at: now}
	pruneEndings(e.done, now, func(v endedSession) time.Time { return v.at })
	_, dead := e.dead[id]
	e.mu.Unlock()
	if dead {
		e.reportNow()
	}
}

// namedDead records the dispatchers a live one named dead: a session open on one ends.
func (e *endings) namedDead(ids []string) {
	if len(ids) == 0 {
		return
	}
	now := time.Now()
	report := false
	e.mu.Lock()
	for _, id := range ids {
		if len(id) > maxIDBytes {
			continue
		}
		if _, known := e.dead[id]; !known {
			if _, ended := e.done[id]; ended {
				report = true
			}
		}
		e.dead[id] = now
		if o, ok := e.open[id]; ok && o.s.ctx.Err() == nil {
			e.log.Info("a live dispatcher found this session's dispatcher dead: ending the session, cancelling what it delivered, to report it ended", "dispatcher", id, "session", o.s.id)
			o.fail(errNamedDead)
		}
	}
	pruneEndings(e.dead, now, func(at time.Time) time.Time { return at })
	e.mu.Unlock()
	if report {
		e.reportNow()
	}
}

// reports are the ended sessions on dispatchers named dead.
func (e *endings) reports() []*pb.EndedSession {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*pb.EndedSession
	for id, ended := range e.done {
		if _, dead := e.dead[id]; dead && len(out) < reportsPerCall {
			out = append(out, &pb.EndedSession{DispatcherId: id, SessionId: ended.session})
		}
	}
	return out
}

// reportNow sends the reports with an ack of every open session on a live dispatcher; a failed
// send is left to the next poll, which carries them too.
func (e *endings) reportNow() {
	reports := e.reports()
	if len(reports) == 0 {
		return
	}
	e.mu.Lock()
	var to []*session
	for id, o := range e.open {
		if _, dead := e.dead[id]; !dead {
			to = append(to, o.s)
		}
	}
	e.mu.Unlock()
	for _, s := range to {
		go func() {
			ctx, cancel := context.WithTimeout(s.ctx, callTimeout)
			defer cancel()
			if _, err := s.client.Ack(ctx, &pb.AckRequest{SessionId: s.id, EndedSessions: reports}); err != nil {
				e.log.V(1).Info("reporting sessions ended failed; the next poll reports them", "session", s.id, "error", err.Error())
			}
		}()
	}
}

// pruneEndings forgets entries older than endingsKeptFor, then the oldest past endingsKept.
func pruneEndings[V any](m map[string]V, now time.Time, at func(V) time.Time) {
	for k, v := range m {
		if now.Sub(at(v)) >= endingsKeptFor {
			delete(m, k)
		}
	}
	for len(m) > endingsKept {
		var oldest string
		var oldestAt time.Time
		first := true
		for k, v := range m {
			if first || at(v).Before(oldestAt) {
				oldest, oldestAt, first = k, at(v), false
			}
		}
		delete(m, oldest)
	}
}
