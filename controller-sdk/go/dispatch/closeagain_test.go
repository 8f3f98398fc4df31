package dispatch_test

import (
	"io"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/tiertest"
)

// stallProxy forwards TCP connections to the API server until stalled: from then on it
// forwards nothing more, in either direction, and accepts connections it never answers, as a
// network partition that drops packets would look to the dispatcher behind it.
type stallProxy struct {
	listener net.Listener
	upstream string
	mu       sync.Mutex
	stalled  chan struct{}
	conns    []net.Conn
}

func startStallProxy(t *testing.T, upstream string) *stallProxy {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{listener: listener, upstream: upstream, stalled: make(chan struct{})}
	t.Cleanup(p.close)
	go p.accept()
	return p
}

func (p *stallProxy) accept() {
	for {
		down, err := p.listener.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		go p.pipe(up, down)
		go p.pipe(down, up)
	}
}

// pipe copies from src to dst while the proxy is not stalled; once it is, what it has read is
// held back and nothing more is read.
func (p *stallProxy) pipe(dst, src net.Conn) {
	buffer := make([]byte, 32<<10)
	for {
		n, err := src.Read(buffer)
		select {
		case <-p.stalled:
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buffer[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = dst.Close()
			}
			return
		}
	}
}

// stall stops every connection, open and to come, forwarding anything.
func (p *stallProxy) stall() { close(p.stalled) }

// close closes the proxy and every connection through it.
func (p *stallProxy) close() {
	_ = p.listener.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// kubeconfigVia writes the local cluster's kubeconfig with its server reached at address (the
// API server's certificate names 127.0.0.1, whatever the port) and returns its path.
func kubeconfigVia(t *testing.T, address string) string {
	t.Helper()
	config, err := clientcmd.LoadFromFile(tiertest.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, cluster := range config.Clusters {
		cluster.Server = "https://" + address
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*config, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitMetric waits, at most within, until the metric at admin is want; it fails the test with
// what it was otherwise, and returns how long it took.
func waitMetric(t *testing.T, admin, name string, want float64, within time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	for {
		got := tiertest.Metric(admin, name)
		if got == want {
			return time.Since(began)
		}
		if time.Since(began) > within {
			t.Fatalf("%s was %v, not %v, after %v", name, got, want, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A lone dispatcher's connection to the API server stalls, so its Lease lapses and the load
// balancer assigns it to nobody; the Go replica closes its session there with nothing in
// flight, the dispatcher cannot write the Lease that would confirm the close, and the replica
// asks again (closeAgain). The load balancer then goes away, so the replica is not assigned the
// dispatcher again (assigned again, it would report the session on its next session there), and
// the dispatcher is killed and started again at its address: its next process takes the
// repeated close as the session's report and serves long before its handover bound (30 s here,
// its longest reconcile), which it waits out when no close is asked again.
func TestAReplicaClosesAgainUntilTheNextProcessTakesTheCloseAsAReport(t *testing.T) {
	const bound = 30 * time.Second
	s := newScene(t, 1, 3)
	d := s.tier.Dispatchers[0]
	server, err := url.Parse(s.config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startStallProxy(t, server.Host)
	// The dispatcher again, with the longer bound, its API server behind the proxy.
	s.tier.Kill(d)
	d.SetEnv("KD_MAX_RECONCILE_TIME", bound.String())
	direct := d.Env
	d.SetEnv("KUBECONFIG", kubeconfigVia(t, proxy.listener.Addr().String()))
	s.tier.Restart(d)
	s.tier.WaitReady(1)
	replica(t, s.config, s.tier, "go-close", "go-0", newLog(), 0)
	s.converged(t)
	proxy.stall()
	// The Lease lapses (4 s and 1 s of grace); assigned to nobody, the replica closes its session.
	waitMetric(t, d.Admin, "kube_dispatch_sessions", 0, 20*time.Second)
	s.tier.Kill(s.tier.LoadBalancer)
	s.tier.Kill(d)
	proxy.close()
	d.Env = direct
	s.tier.Restart(d)
	took := waitMetric(t, d.Admin, "kube_dispatch_ring_serving", 1, bound+20*time.Second)
	t.Logf("the new process served %v after it started (handover bound %v)", took, bound)
	if took >= bound/3 {
		t.Fatalf("the new process served only after %v: it waited for the session the replica closed", took)
	}
	if got := tiertest.Metric(d.Admin, "kube_dispatch_sessions"); got != 0 {
		t.Fatalf("%v sessions on the new process: the replica was assigned the dispatcher again", got)
	}
}
