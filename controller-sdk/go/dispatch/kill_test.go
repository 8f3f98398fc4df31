package dispatch_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatchtest"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/tiertest"
)

// TestHelperReplica is not a test: run by the kill tests as a process of its own (the test
// binary again, with KD_GO_SDK_REPLICA set), it is one replica of the hasher on the tier,
// printing "begin|end <unix nanoseconds> <key>" as each reconcile begins and ends, until it is
// killed.
func TestHelperReplica(t *testing.T) {
	id := os.Getenv("KD_GO_SDK_REPLICA")
	if id == "" {
		t.Skip("run by the kill tests")
	}
	config := tiertest.Config(t)
	tier := &tiertest.Tier{Namespace: os.Getenv("KD_GO_SDK_NAMESPACE"), Tier: &dispatchtest.Tier{LoadBalancer: &tiertest.Process{Listen: os.Getenv("KD_GO_SDK_LB")}}}
	var mu sync.Mutex
	print := func(what, key string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("%s %d %s\n", what, time.Now().UnixNano(), key)
	}
	log := newLog()
	log.observe = print
	replica(t, config, tier, "go-killed", id, log, 30*time.Millisecond)
	select {}
}

// interval is one reconcile of a key by one replica, from its begin to its end (to the
// replica's kill when it never ended).
type interval struct {
	replica    string
	begin, end int64
}

// process is a replica running as a process; its reconciles are read from its output.
type process struct {
	id   string
	cmd  *exec.Cmd
	mu   sync.Mutex
	open map[string]int64
	done []struct {
		key string
		interval
	}
	killed int64
}

func startReplicaProcess(t *testing.T, tier *tiertest.Tier, id string) *process {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperReplica$", "-test.v=false")
	cmd.Env = append(os.Environ(),
		"KD_GO_SDK_REPLICA="+id,
		"KD_GO_SDK_NAMESPACE="+tier.Namespace,
		"KD_GO_SDK_LB="+tier.LoadBalancer.Listen,
	)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{id: id, cmd: cmd, open: map[string]int64{}}
	go func() {
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			fields := strings.Fields(scanner.Text())
			if len(fields) != 3 || (fields[0] != "begin" && fields[0] != "end") {
				continue
			}
			at, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				continue
			}
			p.mu.Lock()
			if fields[0] == "begin" {
				p.open[fields[2]] = at
			} else if begin, ok := p.open[fields[2]]; ok {
				delete(p.open, fields[2])
				p.done = append(p.done, struct {
					key string
					interval
				}{fields[2], interval{id, begin, at}})
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

// kill stops the replica at once (SIGKILL): no drain, no ack, no close.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.mu.Lock()
	p.killed = time.Now().UnixNano()
	p.mu.Unlock()
}

// intervals are every reconcile of every key across processes, a killed process's unfinished
// ones ending at its kill.
func intervals(processes ...*process) map[string][]interval {
	all := map[string][]interval{}
	for _, p := range processes {
		p.mu.Lock()
		for _, d := range p.done {
			all[d.key] = append(all[d.key], d.interval)
		}
		for key, begin := range p.open {
			end := p.killed
			if end == 0 {
				end = time.Now().UnixNano()
			}
			all[key] = append(all[key], interval{p.id, begin, end})
		}
		p.mu.Unlock()
	}
	return all
}

// overlaps are the reconciles of one key that ran at the same time.
func overlaps(all map[string][]interval) []string {
	var found []string
	for key, list := range all {
		sort.Slice(list, func(i, j int) bool { return list[i].begin < list[j].begin })
		for i := 1; i < len(list); i++ {
			if list[i].begin < list[i-1].end {
				found = append(found, fmt.Sprintf("%s: %s began %v before %s ended", key, list[i].replica,
					time.Duration(list[i-1].end-list[i].begin), list[i-1].replica))
			}
		}
	}
	return found
}

// A replica killed with SIGKILL while objects change: the other takes its keys once the
// dispatchers count its session expired, every change is reconciled (lost 0), and no key is
// ever reconciled by both at once (concurrent 0), the killed replica's cut-off reconciles
// counted as running until it died.
func TestAKilledReplicaLosesNothingAndNeverOverlaps(t *testing.T) {
	s := newScene(t, 2, 30)
	a := startReplicaProcess(t, s.tier, "go-a")
	b := startReplicaProcess(t, s.tier, "go-b")
	s.converged(t)
	s.changeAll(t, 3, a.kill)
	s.converged(t)
	all := intervals(a, b)
	if found := overlaps(all); len(found) > 0 {
		t.Fatalf("reconciles of one key overlapped: %v", found)
	}
	byReplica := map[string]int{}
	for _, list := range all {
		for _, i := range list {
			byReplica[i.replica]++
		}
	}
	if byReplica["go-a"] == 0 || byReplica["go-b"] == 0 {
		t.Fatalf("the replicas did not share the keys: %v", byReplica)
	}
}

// A dispatcher killed with SIGKILL while objects change: its keys move to the others once its
// Lease expires, every change is reconciled, and no key is reconciled twice at once.
func TestAKilledDispatcherLosesNothingAndNeverOverlaps(t *testing.T) {
	s := newScene(t, 3, 30)
	log := newLog()
	replica(t, s.config, s.tier, "go-dkill", "go-0", log, 20*time.Millisecond)
	replica(t, s.config, s.tier, "go-dkill", "go-1", log, 20*time.Millisecond)
	s.converged(t)
	s.changeAll(t, 3, func() { s.tier.Kill(s.tier.Dispatchers[1]) })
	s.converged(t)
	if found := log.overlapsNow(); len(found) > 0 {
		t.Fatalf("reconciles of one key overlapped: %v", found)
	}
}

// A dispatcher killed with SIGKILL while Go replicas hold sessions there: the replicas' sessions
// end with the process, and once the survivors find its Lease expired (4 s + 1 s grace) and
// name it dead, each replica reports its session there ended, so its keys are taken over
// without waiting out the handover bound (10 s, the tier's longest reconcile): every object
// changed right after the kill is reconciled well before the Lease, grace and bound have
// passed, and no key is reconciled twice at once.
func TestAKilledDispatchersKeysAreTakenOverOnceItsSessionsAreReportedEnded(t *testing.T) {
	s := newScene(t, 3, 30)
	log := newLog()
	replica(t, s.config, s.tier, "go-report", "go-0", log, 0)
	replica(t, s.config, s.tier, "go-report", "go-1", log, 0)
	s.converged(t)
	killed := time.Now()
	s.tier.Kill(s.tier.Dispatchers[1])
	s.changeAll(t, 1, nil)
	s.converged(t)
	took := time.Since(killed)
	const lease, grace, bound = 4 * time.Second, time.Second, 10 * time.Second
	if took < lease-time.Second {
		t.Fatalf("every change reconciled %v after the kill, before the killed dispatcher's Lease expired", took)
	}
	if took >= lease+grace+bound-2*time.Second {
		t.Fatalf("every change reconciled %v after the kill: the survivors waited out the bound (%v after the Lease and grace) instead of the replicas' reports", took, bound)
	}
	if found := log.overlapsNow(); len(found) > 0 {
		t.Fatalf("reconciles of one key overlapped: %v", found)
	}
	t.Logf("every change made after the kill reconciled %v after it (Lease %v + grace %v; the bound would add %v)", took, lease, grace, bound)
}
