package dispatch

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// fakeService is a dispatcher Service that names addresses, and an assigned name that stands
// for another; it counts its lookups.
type fakeService struct {
	mu      sync.Mutex
	lookups int
	names   map[string][]netip.AddrPort
}

func (f *fakeService) resolve(_ context.Context, name string) ([]netip.AddrPort, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups++
	if addresses, ok := f.names[name]; ok {
		return addresses, nil
	}
	return nil, errors.New("no such host")
}

func (f *fakeService) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups
}

// published waits for the next set of dispatchers handed to the supervisor.
func published(t *testing.T, polled <-chan []string, within time.Duration) []string {
	t.Helper()
	select {
	case p := <-polled:
		return p
	case <-time.After(within):
		t.Fatalf("nothing published within %v", within)
		return nil
	}
}

// Registration fails from the start: the replica polls what the Service names once it has
// failed for the fallback time, not before; an assignment replaces it all and stops the
// lookups; a registration that fails again adds the Service's dispatchers again, never
// dropping the assigned ones, nor adding one the assignment names under another spelling.
func TestTheServiceIsPolledOnlyWhileRegistrationHasFailedForAWhile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := netip.MustParseAddrPort
	service := &fakeService{names: map[string][]netip.AddrPort{
		"dispatchers.test:7070":  {a("10.0.0.1:7070"), a("10.0.0.2:7070"), a("10.0.0.3:7070")},
		"dispatcher-3.test:7070": {a("10.0.0.3:7070")},
	}}
	polled := make(chan []string, 8)
	started := time.Now()
	d := newDiscovery(logr.Discard(), "dispatchers.test:7070", service.resolve, func(p []string) { polled <- p })
	// One lookup per failure: the test sees each before the next can start.
	d.after, d.every = 300*time.Millisecond, time.Hour
	go d.run(ctx)

	first := published(t, polled, 5*time.Second)
	if waited := time.Since(started); waited < d.after {
		t.Fatalf("the Service was polled %v after the start, before the fallback time", waited)
	}
	if want := []string{"10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"}; !slices.Equal(first, want) {
		t.Fatalf("polled %q, want %q", first, want)
	}

	// Registered: the assignment is all that is polled, and the Service is left alone.
	d.assignment([]string{"10.0.0.2:7070", "dispatcher-3.test:7070"})
	if got, want := published(t, polled, time.Second), []string{"10.0.0.2:7070", "dispatcher-3.test:7070"}; !slices.Equal(got, want) {
		t.Fatalf("polled %q, want %q", got, want)
	}
	lookups := service.count()
	time.Sleep(3 * d.after)
	if service.count() != lookups {
		t.Fatal("the Service was looked up while registered")
	}
	if got := d.polling(); !slices.Equal(got, []string{"10.0.0.2:7070", "dispatcher-3.test:7070"}) {
		t.Fatalf("a registration would name %q", got)
	}

	// The registration ends: the assignment stays, and the Service adds 10.0.0.1 only:
	// 10.0.0.3 is the assigned dispatcher-3 under another spelling.
	failed := time.Now()
	d.failed()
	got := published(t, polled, 5*time.Second)
	if want := []string{"10.0.0.1:7070", "10.0.0.2:7070", "dispatcher-3.test:7070"}; !slices.Equal(got, want) {
		t.Fatalf("polled %q, want %q", got, want)
	}
	if waited := time.Since(failed); waited < d.after {
		t.Fatalf("the Service was polled %v after the failure, before the fallback time", waited)
	}
}

// Without a Service the replica polls what it was assigned last, however long registration
// fails.
func TestWithoutAServiceTheLastAssignmentStands(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	polled := make(chan []string, 8)
	d := newDiscovery(logr.Discard(), "", nil, func(p []string) { polled <- p })
	d.after, d.every = 10*time.Millisecond, 10*time.Millisecond
	done := make(chan struct{})
	go func() { d.run(ctx); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return without a Service")
	}
	d.assignment([]string{"10.0.0.1:7070"})
	<-polled
	d.failed()
	if got := d.polling(); !slices.Equal(got, []string{"10.0.0.1:7070"}) {
		t.Fatalf("polling %q", got)
	}
}

// A Service naming more dispatchers than a registration can carry adds the first 64.
func TestTheServiceAddsAtMost64Dispatchers(t *testing.T) {
	many := make([]netip.AddrPort, 100)
	for i := range many {
		many[i] = netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(7000+i))
	}
	service := &fakeService{names: map[string][]netip.AddrPort{"dispatchers.test:7070": many}}
	d := newDiscovery(logr.Discard(), "dispatchers.test:7070", service.resolve, func([]string) {})
	d.lookUp(context.Background(), nil, 0)
	d.lookUp(context.Background(), nil, 0)
	if got := len(d.polling()); got != mostFound {
		t.Fatalf("polling %d dispatchers, want %d", got, mostFound)
	}
}

// A lookup that began before an assignment is dropped when it returns, even if registration
// failed again meanwhile: its result would come before the fallback time of the new failure.
func TestALookupStartedBeforeAnAssignmentIsDropped(t *testing.T) {
	a := netip.MustParseAddrPort
	service := &fakeService{names: map[string][]netip.AddrPort{"dispatchers.test:7070": {a("10.0.0.1:7070")}}}
	var published [][]string
	d := newDiscovery(logr.Discard(), "dispatchers.test:7070", service.resolve, func(p []string) { published = append(published, p) })
	d.mu.Lock()
	assigned, before := slices.Clone(d.assigned), d.assignments
	d.mu.Unlock()
	d.assignment([]string{"10.0.0.2:7070"})
	d.failed()
	d.lookUp(context.Background(), assigned, before)
	if got := d.polling(); !slices.Equal(got, []string{"10.0.0.2:7070"}) {
		t.Fatalf("polling %q after a stale lookup", got)
	}
	d.lookUp(context.Background(), []string{"10.0.0.2:7070"}, before+1)
	if got := d.polling(); !slices.Equal(got, []string{"10.0.0.1:7070", "10.0.0.2:7070"}) {
		t.Fatalf("polling %q after a current lookup", got)
	}
	if got := d.assignedLast(); !slices.Equal(got, []string{"10.0.0.2:7070"}) {
		t.Fatalf("a registration would name %q, not only the assigned dispatchers", got)
	}
}

// A dispatcher Service without a port fails the build, saying what it must be; from the
// environment too.
func TestADispatcherServiceMustBeHostAndPort(t *testing.T) {
	if _, _, err := (Options{DispatcherService: "kube-dispatch-dispatcher.kube-dispatch.svc"}).withDefaults("c"); err == nil || !strings.Contains(err.Error(), "must be host:port") {
		t.Fatalf("want an error that says it must be host:port, got %v", err)
	}
	t.Setenv("KD_DISPATCHER_SERVICE", " kube-dispatch-dispatcher.kube-dispatch.svc:7070 ")
	o, _, err := (Options{}).withDefaults("c")
	if err != nil || o.DispatcherService != "kube-dispatch-dispatcher.kube-dispatch.svc:7070" {
		t.Fatalf("from the environment: %q, %v", o.DispatcherService, err)
	}
}
