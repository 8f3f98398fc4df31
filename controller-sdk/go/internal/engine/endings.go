package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
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
// see ended. A session this replica holds on one of them when it is named ends at once as
// lost: what it delivered is cancelled, and it counts as ended only once every reconcile has
// returned. While its dispatcher is named dead (in the last answer of some open session), an
// ended session is reported with every poll, and at once with an ack of each open session (its
// full id, which only this replica knows). A session opened on a dispatcher named dead is not
// ended for it: a dead or cut-off dispatcher can list no new session on its Lease.
//
// A dispatcher restarted after a crash says so in its answers (previous_process_died): it waits
// for the sessions its previous process listed, which bear the same dispatcher id. Those this
// replica ended there are reported as for a dispatcher named dead; the session the answer came
// on is the new process's and goes on. A session still held with the previous process (not yet
// noticed gone) ends by itself as its calls fail, and is reported then.
//
// Bounds: the last endedPerDispatcher ended sessions of at most endingsKept dispatchers, each
// forgotten after endingsKeptFor; one list of dispatchers named dead per open session (at most
// endingsKept ids each); a call reports at most reportsPerCall.

const (
	endingsKept        = 64
	endedPerDispatcher = 4
	endingsKeptFor     = 10 * time.Minute
	reportsPerCall     = 16
	maxIDBytes         = 256
)

// errNamedDead ends a session whose dispatcher a live dispatcher named dead.
var errNamedDead = errors.New("the other dispatchers found this dispatcher dead: session ended, to be reported so they take its keys over")

type endedSession struct {
	session string
	at      time.Time
}

type openSession struct {
	s    *Session
	fail context.CancelCauseFunc
}

// Endings is the replica's record of sessions for the takeover of a dead dispatcher.
type Endings struct {
	log   logr.Logger
	mu    sync.Mutex
	done  map[string][]endedSession // per dispatcher id: the sessions ended there, newest last
	named map[string][]string       // per dispatcher id of an open session: what its last answer named dead
	open  map[string]openSession    // per dispatcher id
	// cursor is where the next call's reports start among those to report, so that past
	// reportsPerCall every one goes out in turn.
	cursor int
}

func NewEndings(log logr.Logger) *Endings {
	return &Endings{
		log:   log,
		done:  map[string][]endedSession{},
		named: map[string][]string{},
		open:  map[string]openSession{},
	}
}

// isDead says whether some open session's last answer named id dead; e.mu is held.
func (e *Endings) isDead(id string) bool {
	for _, ids := range e.named {
		if slices.Contains(ids, id) {
			return true
		}
	}
	return false
}

// opened records session s on dispatcher id; fail ends it (as lost) when id is named dead
// while it is open.
func (e *Endings) opened(id string, s *Session, fail context.CancelCauseFunc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.open[id] = openSession{s: s, fail: fail}
}

// ended records that session on dispatcher id has ended and every reconcile it delivered has
// returned; if id is named dead, the open sessions report it at once. What the session's
// answers named dead is forgotten.
func (e *Endings) ended(id, session string) {
	now := time.Now()
	e.mu.Lock()
	if o, ok := e.open[id]; ok && o.s.id == session {
		delete(e.open, id)
		delete(e.named, id)
	}
	sessions := slices.DeleteFunc(e.done[id], func(x endedSession) bool { return x.session == session })
	sessions = append(sessions, endedSession{session: session, at: now})
	if len(sessions) > endedPerDispatcher {
		sessions = sessions[len(sessions)-endedPerDispatcher:]
	}
	e.done[id] = sessions
	for k, list := range e.done {
		list = slices.DeleteFunc(list, func(x endedSession) bool { return now.Sub(x.at) >= endingsKeptFor })
		if len(list) == 0 {
			delete(e.done, k)
		} else {
			e.done[k] = list
		}
	}
	for len(e.done) > endingsKept {
		var oldest string
		var oldestAt time.Time
		first := true
		for k, list := range e.done {
			if at := list[len(list)-1].at; first || at.Before(oldestAt) {
				oldest, oldestAt, first = k, at, false
			}
		}
		delete(e.done, oldest)
	}
	dead := e.isDead(id)
	e.mu.Unlock()
	if dead {
		e.reportNow()
	}
}

// namedDead records that the last answer on the session with dispatcher source named ids dead,
// and whether source's own previous process died (previous): a session open on one of ids
// ends; the sessions ended on all of them are reported. The session open on source is the
// answering (new) process's and goes on.
func (e *Endings) namedDead(source string, ids []string, previous bool) {
	e.mu.Lock()
	var dead []string
	for _, id := range ids {
		if len(id) <= maxIDBytes && id != source && len(dead) < endingsKept {
			dead = append(dead, id)
		}
	}
	report := false
	for _, id := range dead {
		if _, ended := e.done[id]; ended && !e.isDead(id) {
			report = true
		}
		if o, ok := e.open[id]; ok && o.s.named.Err() == nil {
			e.log.Info("a live dispatcher found this session's dispatcher dead: ending the session, cancelling what it delivered, to report it ended", "dispatcher", id, "session", o.s.id)
			o.fail(errNamedDead)
		}
	}
	if previous {
		if _, ended := e.done[source]; ended && !e.isDead(source) {
			report = true
		}
		dead = append(dead, source)
	}
	if len(dead) == 0 {
		delete(e.named, source)
	} else if _, ok := e.open[source]; ok {
		e.named[source] = dead
	}
	e.mu.Unlock()
	if report {
		e.reportNow()
	}
}

// reports are the ended sessions on dispatchers named dead, newest first; past reportsPerCall,
// each call starts where the last one stopped.
func (e *Endings) reports() []*pb.EndedSession {
	e.mu.Lock()
	defer e.mu.Unlock()
	type reportable struct {
		at         time.Time
		dispatcher string
		session    string
	}
	var all []reportable
	for id, sessions := range e.done {
		if !e.isDead(id) {
			continue
		}
		for _, ended := range sessions {
			all = append(all, reportable{ended.at, id, ended.session})
		}
	}
	if len(all) == 0 {
		return nil
	}
	// A total order, so that the cursor walks the same sequence from one call to the next.
	slices.SortFunc(all, func(a, b reportable) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		if c := strings.Compare(a.dispatcher, b.dispatcher); c != 0 {
			return c
		}
		return strings.Compare(a.session, b.session)
	})
	start := 0
	if len(all) > reportsPerCall {
		start = e.cursor % len(all)
	}
	n := min(len(all), reportsPerCall)
	out := make([]*pb.EndedSession, 0, n)
	for i := range n {
		r := all[(start+i)%len(all)]
		out = append(out, &pb.EndedSession{DispatcherId: r.dispatcher, SessionId: r.session})
	}
	e.cursor = (start + n) % len(all)
	return out
}

// reportNow sends the reports with an ack of every open session on a dispatcher not named dead
// (or named only for its previous process, by itself); a failed send is left to the next poll,
// which carries them too.
func (e *Endings) reportNow() {
	reports := e.reports()
	if len(reports) == 0 {
		return
	}
	e.mu.Lock()
	var to []*Session
	for id, o := range e.open {
		if !e.isDead(id) || slices.Contains(e.named[id], id) {
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
