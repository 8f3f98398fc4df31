// Package tiertest starts a real kube-dispatch tier for the SDK's tests: dispatcher and load
// balancer processes (the binaries `cargo build --bins` made) against the local API server the
// project's scripts start (tests/cluster/cluster.sh), on loopback, with plaintext and no
// tokens, or secured as deployed (Options.Secure). Each test gets a namespace of its own,
// deleted when it ends.
package tiertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Root is the repository's root, from this package's directory.
func Root() string {
	dir, _ := os.Getwd()
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "Cargo.toml")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "controller-sdk")); err == nil {
				return d
			}
		}
	}
	return dir
}

// Config is the API server's: KUBECONFIG, else the local cluster's kubeconfig. Without one the
// test is skipped, unless KD_REQUIRE_CLUSTER is set (make test sets it), when it fails.
func Config(t testing.TB) *rest.Config {
	t.Helper()
	path := Kubeconfig()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("KD_REQUIRE_CLUSTER") != "" {
			t.Fatalf("no kubeconfig at %s: start the local API server with tests/cluster/cluster.sh up", path)
		}
		t.Skipf("no kubeconfig at %s (tests/cluster/cluster.sh up starts the local API server)", path)
	}
	config, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	config.QPS, config.Burst = 200, 400
	return config
}

// Namespace creates a namespace for t, deleted when t ends.
func Namespace(t testing.TB, client kubernetes.Interface) string {
	t.Helper()
	ns, err := client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "go-sdk-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// Tester is the user of the local cluster's test identity (tokens/tester.token): a
// ServiceAccount bound to cluster-admin.
const Tester = "system:serviceaccount:kube-dispatch-tests:tester"

// Process is a component of the tier running as a process.
type Process struct {
	Name   string
	Listen string
	Admin  string
	Log    string
	cmd    *exec.Cmd
	env    []string
	binary string
	// exited is closed once the running process has been waited for.
	exited chan struct{}
	// logFrom is the size of the log when the running process started.
	logFrom int64
}

// Tier is a running tier.
type Tier struct {
	t            testing.TB
	Namespace    string
	Dispatchers  []*Process
	LoadBalancer *Process
	// Others are the processes started with Run.
	Others []*Process
}

// Options change how a tier runs.
type Options struct {
	// Secure serves TLS with the local cluster's test certificate (for 127.0.0.1, signed by
	// ClusterDir()/pki/ca.crt) and takes only calls with a token the API server accepts
	// (audience kube-dispatch) from a user allowed to read what they subscribe to; the
	// dispatchers call each other as the test identity (tokens/tester.token).
	Secure bool
	// Env is added to every process's environment (KD_ flags).
	Env []string
}

// Kubeconfig is the local API server's kubeconfig: KUBECONFIG, else the local cluster's.
func Kubeconfig() string {
	if kubeconfig := os.Getenv("KUBECONFIG"); kubeconfig != "" {
		return kubeconfig
	}
	return filepath.Join(Root(), ".cluster", "kubeconfig")
}

// ClusterDir is the local cluster's directory (tests/cluster/cluster.sh): the kubeconfig's.
func ClusterDir() string { return filepath.Dir(Kubeconfig()) }

// Start runs n dispatchers, their ring in namespace's Leases, and a load balancer, in
// plaintext without tokens, and waits until the load balancer leads and knows them all and
// each dispatcher serves its share.
func Start(t testing.TB, namespace string, n int) *Tier {
	t.Helper()
	return StartWith(t, namespace, n, Options{})
}

// StartWith is Start with options.
func StartWith(t testing.TB, namespace string, n int, options Options) *Tier {
	t.Helper()
	tier := &Tier{t: t, Namespace: namespace}
	common := []string{"KUBECONFIG=" + Kubeconfig(), "KD_LOG_JSON=1"}
	if options.Secure {
		pki := filepath.Join(ClusterDir(), "pki")
		common = append(common,
			"KD_TLS_CERT_FILE="+filepath.Join(pki, "kube-dispatch.crt"),
			"KD_TLS_KEY_FILE="+filepath.Join(pki, "kube-dispatch.key"),
			"KD_TLS_CA_FILE="+filepath.Join(pki, "ca.crt"),
			"KD_TOKEN_FILE="+filepath.Join(ClusterDir(), "tokens", "tester.token"),
			"KD_PEER_USERS="+Tester,
		)
	} else {
		common = append(common, "KD_INSECURE=1", "KD_ALLOW_ANONYMOUS=1")
	}
	common = append(common, options.Env...)
	for i := range n {
		p := &Process{Name: fmt.Sprintf("dispatcher-%d", i), Listen: freeAddress(t), Admin: freeAddress(t)}
		p.binary = binary(t, "kube-dispatch-dispatcher")
		p.env = append(append([]string(nil), common...),
			"KD_DISPATCHER_ID="+p.Name,
			"KD_LISTEN="+p.Listen,
			"KD_ADMIN_LISTEN="+p.Admin,
			"KD_LEASE_NAMESPACE="+namespace,
			"KD_LEASE_DURATION=4s",
			"KD_LEASE_RENEW_PERIOD=1s",
			"KD_LEASE_GRACE=1s",
			"KD_MAX_SESSION_TTL=5s",
			"KD_MAX_POLL_WAIT=2s",
			"KD_MAX_RECONCILE_TIME=10s",
			"KD_RESYNC_INTERVAL=0s",
		)
		tier.Dispatchers = append(tier.Dispatchers, p)
	}
	lb := &Process{Name: "loadbalancer", Listen: freeAddress(t), Admin: freeAddress(t)}
	lb.binary = binary(t, "kube-dispatch-loadbalancer")
	lb.env = append(append([]string(nil), common...),
		"KD_LISTEN="+lb.Listen,
		"KD_ADMIN_LISTEN="+lb.Admin,
		"KD_NAMESPACE="+namespace,
		"KD_LEASE_DURATION=4s",
		"KD_LEASE_GRACE=1s",
		"KD_DISPATCHER_GRACE=1s",
		"KD_REPLICA_GRACE=3s",
	)
	tier.LoadBalancer = lb
	for _, p := range tier.Dispatchers {
		tier.run(p)
	}
	tier.run(lb)
	t.Cleanup(tier.stopAll)
	tier.WaitReady(n)
	return tier
}

// run starts p, its output in a log file of the test's.
func (tier *Tier) run(p *Process) {
	t := tier.t
	t.Helper()
	if p.Log == "" {
		p.Log = filepath.Join(t.TempDir(), p.Name+".log")
	}
	out, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p.logFrom = 0
	if info, err := out.Stat(); err == nil {
		p.logFrom = info.Size()
	}
	cmd := exec.Command(p.binary)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start %s: %v", p.binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = out.Close(); close(exited) }()
	p.cmd, p.exited = cmd, exited
}

// Run starts another process of the test (a controller replica of another SDK, say) from the
// binary cargo built at path (under target/debug, such as "examples/configmap_hasher"), with
// env as its whole environment; it is stopped with the tier.
func (tier *Tier) Run(name, path string, env ...string) *Process {
	tier.t.Helper()
	p := &Process{Name: name, binary: binary(tier.t, path), env: env}
	tier.Others = append(tier.Others, p)
	tier.run(p)
	return p
}

// Kill stops p at once (SIGKILL): no graceful handover.
func (tier *Tier) Kill(p *Process) {
	if p.cmd != nil {
		_ = p.cmd.Process.Kill()
		<-p.exited
		p.cmd = nil
	}
}

// Restart starts p again at the same addresses.
func (tier *Tier) Restart(p *Process) { tier.run(p) }

func (tier *Tier) stopAll() {
	all := append(append(append([]*Process(nil), tier.Others...), tier.Dispatchers...), tier.LoadBalancer)
	for _, p := range all {
		if p.cmd != nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.After(10 * time.Second)
	for _, p := range all {
		if p.cmd == nil {
			continue
		}
		select {
		case <-p.exited:
			p.cmd = nil
		case <-deadline:
		}
		tier.Kill(p)
	}
	if tier.t.Failed() {
		// The logs live in the test's temporary folder, removed once it ends: their ends go
		// into the test's output.
		for _, p := range all {
			tier.t.Logf("%s log %s, its last lines:\n%s", p.Name, p.Log, tail(p.Log, 40))
		}
	}
}

// tail is the last n lines of the file at path, or why it cannot be read.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// WaitReady waits until the load balancer leads and knows n dispatchers and every running
// dispatcher is ready and serving its share of a ring of n.
func (tier *Tier) WaitReady(n int) {
	tier.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	rebound := 0
	for {
		for _, p := range append(append([]*Process(nil), tier.Dispatchers...), tier.LoadBalancer) {
			if rebound < 5 && tier.rebindIfTaken(p) {
				rebound++
			}
		}
		ready := metric(tier.LoadBalancer.Admin, "kube_dispatch_lb_leader") == 1 &&
			metric(tier.LoadBalancer.Admin, "kube_dispatch_lb_dispatchers") == float64(n)
		for _, d := range tier.Dispatchers {
			if d.cmd == nil {
				continue
			}
			ready = ready && metric(d.Admin, "kube_dispatch_ring_members") == float64(n) &&
				metric(d.Admin, "kube_dispatch_ring_serving") == 1 && status(d.Admin, "/readyz") == http.StatusOK
		}
		if ready {
			return
		}
		if time.Now().After(deadline) {
			lb := tier.LoadBalancer.Admin
			tier.t.Fatalf("the tier was not ready within 60 s (load balancer: leader %v, dispatchers %v of %d); logs: %s",
				metric(lb, "kube_dispatch_lb_leader"), metric(lb, "kube_dispatch_lb_dispatchers"), n, tier.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rebindIfTaken starts p again on fresh addresses if it exited because one of its addresses
// was taken (freeAddress finds addresses free only when it looks: a process of a test running
// beside this one may bind one first); returns whether it did.
func (tier *Tier) rebindIfTaken(p *Process) bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
	default:
		return false
	}
	data, err := os.ReadFile(p.Log)
	if err != nil || int64(len(data)) < p.logFrom ||
		!strings.Contains(string(data[p.logFrom:]), "Address already in use") {
		return false
	}
	p.Listen, p.Admin = freeAddress(tier.t), freeAddress(tier.t)
	p.env = withEnv(withEnv(p.env, "KD_LISTEN", p.Listen), "KD_ADMIN_LISTEN", p.Admin)
	tier.t.Logf("%s: an address was taken before it could bind it; starting it again on %s (admin %s)",
		p.Name, p.Listen, p.Admin)
	p.cmd = nil
	tier.run(p)
	return true
}

// withEnv is env with name set to value.
func withEnv(env []string, name, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return append(out, name+"="+value)
}

func (tier *Tier) logs() string {
	var paths []string
	all := append(append(append([]*Process(nil), tier.Dispatchers...), tier.LoadBalancer), tier.Others...)
	for _, p := range all {
		paths = append(paths, p.Log)
	}
	return strings.Join(paths, " ")
}

// Metric is the sum of the samples of name on the admin endpoint at admin (-1 when it cannot
// be read).
func Metric(admin, name string) float64 { return metric(admin, name) }

func metric(admin, name string) float64 {
	client := http.Client{Timeout: time.Second}
	response, err := client.Get("http://" + admin + "/metrics")
	if err != nil {
		return -1
	}
	defer func() { _ = response.Body.Close() }()
	sum := 0.0
	scanner := bufio.NewScanner(io.LimitReader(response.Body, 8<<20))
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for scanner.Scan() {
		line := scanner.Text()
		rest, found := strings.CutPrefix(line, name)
		if !found || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		fields := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			sum += v
		}
	}
	return sum
}

func status(admin, path string) int {
	client := http.Client{Timeout: time.Second}
	response, err := client.Get("http://" + admin + path)
	if err != nil {
		return 0
	}
	_ = response.Body.Close()
	return response.StatusCode
}

// binary is the path of a binary cargo built: KD_BIN_DIR, else target/debug.
func binary(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("KD_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(Root(), "target", "debug")
		if target := os.Getenv("CARGO_TARGET_DIR"); target != "" {
			dir = filepath.Join(target, "debug")
		}
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("no %s: build it with cargo build --bins (or set KD_BIN_DIR)", path)
	}
	return path
}

// freeAddress is a loopback address with a port free now.
func freeAddress(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}
