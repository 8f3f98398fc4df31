package dispatch

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// Where a replica finds dispatchers while no load balancer answers: the dispatchers' headless
// Service (Options.DispatcherService), looked up once registration has failed for
// fallbackAfter. Placement by the load balancer is about balance only; the dispatchers keep
// every key to one replica at a time whoever polls them, so a replica that cannot register may
// poll dispatchers it found itself. It keeps those assigned last and adds those the Service
// names, never dropping one (at most mostFound, so a long outage that churns many pod
// addresses stops adding), until an assignment replaces them all. Its registrations name only
// the dispatchers assigned last, so a new leader keeps what it can of the last placement.
//
// One dispatcher polled under two spellings would have this replica's two sessions there
// replace each other. What an assigned name stands for is not added; a dual-stack Service,
// which names each pod by an IPv4 and an IPv6 address, would still be polled twice per pod:
// keep the dispatcher Service single-stack, as deploy/ installs it.

const (
	// fallbackAfter is how long registration must have failed before the Service is looked
	// up: longer than a standby load balancer takes to lead after a clean stop.
	fallbackAfter = 10 * time.Second
	// resolveEvery is how often the Service is looked up while registration still fails.
	resolveEvery = 5 * time.Second
	// resolveTimeout bounds one lookup.
	resolveTimeout = 5 * time.Second
	// mostFound is the most dispatchers added from the Service, all lookups together: as many
	// as the load balancer reads of a registration.
	mostFound = 64
)

// Resolver looks up host:port (the dispatcher Service, or an assigned dispatcher's address
// that is not an IP address) as the socket addresses it stands for.
type Resolver func(ctx context.Context, hostport string) ([]netip.AddrPort, error)

// resolveDNS is the default Resolver: the host in DNS, the port as given.
func resolveDNS(ctx context.Context, hostport string) ([]netip.AddrPort, error) {
	host, portText, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port of %q: %w", hostport, err)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	addresses := make([]netip.AddrPort, 0, len(ips))
	for _, ip := range ips {
		addresses = append(addresses, netip.AddrPortFrom(ip.Unmap(), uint16(port)))
	}
	return addresses, nil
}

// discovery is what a replica that follows the load balancer polls: the dispatchers assigned
// last, and those found in the Service while registration fails.
type discovery struct {
	log     logr.Logger
	service string
	resolve Resolver
	// publish hands what the replica polls to the supervisor.
	publish func([]string)
	// after and every are fallbackAfter and resolveEvery (shorter in tests).
	after, every time.Duration

	mu       sync.Mutex
	assigned []string
	// assignments counts the assignments taken: a lookup started before the last one is
	// dropped.
	assignments uint64
	// failingSince is when registration last failed; zero while registered.
	failingSince time.Time
	// nextLookup is when the Service is looked up next after a first lookup, every
	// resolveEvery; zero before it (the first comes fallbackAfter into the failure) and while
	// registered.
	nextLookup time.Time
	// changed wakes run when nextLookup changes.
	changed chan struct{}
	found   map[string]struct{}
}

func newDiscovery(log logr.Logger, service string, resolve Resolver, publish func([]string)) *discovery {
	if resolve == nil {
		resolve = resolveDNS
	}
	// Not registered yet: a replica that starts while no load balancer leads finds its
	// dispatchers too.
	return &discovery{
		log: log, service: service, resolve: resolve, publish: publish,
		after: fallbackAfter, every: resolveEvery,
		failingSince: time.Now(), changed: make(chan struct{}, 1), found: map[string]struct{}{},
	}
}

// assignment takes an assignment: it is all the replica polls from now on.
func (d *discovery) assignment(dispatchers []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.assigned = slices.Clone(dispatchers)
	d.assignments++
	d.failingSince, d.nextLookup = time.Time{}, time.Time{}
	d.wake()
	if len(d.found) > 0 {
		d.log.Info("registered again: polling what the load balancer assigns, not what the Service named", "found", d.foundLocked())
		clear(d.found)
	}
	d.publishLocked()
}

// failed marks the registration as ended; the assignment stays in force.
func (d *discovery) failed() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failingSince.IsZero() {
		d.failingSince = time.Now()
		d.wake()
	}
}

// wake tells run that nextLookup changed.
func (d *discovery) wake() {
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

// assignedLast is what each registration names: the dispatchers assigned last, so a load
// balancer that has just become the leader places the replica there and a change of leader
// moves no session. Not those found in the Service, which every replica would name: the hint
// would be lost.
func (d *discovery) assignedLast() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.assigned)
}

// polling is what the replica polls now: the dispatchers assigned last and those found.
func (d *discovery) polling() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pollingLocked()
}

func (d *discovery) pollingLocked() []string {
	polled := append(slices.Clone(d.assigned), d.foundLocked()...)
	slices.Sort(polled)
	return slices.Compact(polled)
}

// run looks up the Service every resolveEvery once registration has failed for
// fallbackAfter, until ctx ends. It returns at once without a Service.
func (d *discovery) run(ctx context.Context) {
	if d.service == "" {
		return
	}
	d.log.Info("the dispatcher Service is looked up while no load balancer answers", "service", d.service, "after", d.after.String())
	for {
		d.mu.Lock()
		next := d.lookupAtLocked()
		d.mu.Unlock()
		var due <-chan time.Time
		var timer *time.Timer
		if !next.IsZero() {
			timer = time.NewTimer(time.Until(next))
			due = timer.C
		}
		select {
		case <-ctx.Done():
		case <-d.changed:
		case <-due:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		d.mu.Lock()
		next = d.lookupAtLocked()
		stillDue := !next.IsZero() && !time.Now().Before(next)
		if stillDue {
			d.nextLookup = time.Now().Add(d.every)
		}
		assigned, assignments := slices.Clone(d.assigned), d.assignments
		d.mu.Unlock()
		if stillDue {
			d.lookUp(ctx, assigned, assignments)
		}
	}
}

// lookupAtLocked is when the Service is looked up next; zero while registered.
func (d *discovery) lookupAtLocked() time.Time {
	switch {
	case d.failingSince.IsZero():
		return time.Time{}
	case d.nextLookup.IsZero():
		return d.failingSince.Add(d.after)
	default:
		return d.nextLookup
	}
}

// lookUp adds the dispatchers the Service names beyond those assigned, unless an assignment
// came after the one counted assignments (the lookup began under it).
func (d *discovery) lookUp(ctx context.Context, assigned []string, assignments uint64) {
	resolved, err := d.lookup(ctx, d.service)
	if err != nil {
		d.log.Info("cannot look up the dispatcher Service; polling the dispatchers assigned last", "service", d.service, "error", err.Error())
		return
	}
	// One dispatcher polled under two spellings would have this replica's two sessions there
	// replace each other: what an assigned name stands for is not added.
	assignedAs := map[netip.AddrPort]struct{}{}
	for _, name := range assigned {
		if addresses, err := d.lookup(ctx, name); err == nil {
			for _, a := range addresses {
				assignedAs[a] = struct{}{}
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// An assignment that arrived meanwhile wins, even if it failed since.
	if d.failingSince.IsZero() || d.assignments != assignments {
		return
	}
	var added []string
	for _, a := range resolved {
		spelled := a.String()
		if len(d.found) >= mostFound {
			break
		}
		_, aliased := assignedAs[a]
		_, known := d.found[spelled]
		if aliased || known || slices.Contains(d.assigned, spelled) {
			continue
		}
		d.found[spelled] = struct{}{}
		added = append(added, spelled)
	}
	if len(added) > 0 {
		d.log.Info("no load balancer answers: polling dispatchers found in the Service besides those assigned last", "service", d.service, "added", added, "failingFor", time.Since(d.failingSince).String())
		d.publishLocked()
	}
}

// lookup is what name stands for: itself when it is an IP address and port, else what the
// resolver says within resolveTimeout.
func (d *discovery) lookup(ctx context.Context, name string) ([]netip.AddrPort, error) {
	if a, err := netip.ParseAddrPort(name); err == nil {
		return []netip.AddrPort{a}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	return d.resolve(ctx, name)
}

func (d *discovery) foundLocked() []string {
	found := make([]string, 0, len(d.found))
	for a := range d.found {
		found = append(found, a)
	}
	slices.Sort(found)
	return found
}

// publishLocked hands the dispatchers assigned and found to the supervisor.
func (d *discovery) publishLocked() {
	d.publish(d.pollingLocked())
}
