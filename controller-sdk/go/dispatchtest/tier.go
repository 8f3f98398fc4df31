// Package dispatchtest runs a kube-dispatch tier for a controller's tests, beside the API
// server of envtest: the dispatcher and load balancer binaries as processes on loopback, in
// plaintext and without tokens, against the API server of a rest.Config. A controller's
// envtest suite runs on the tier with its Environment made by this package, whose Start runs
// the tier too, and its manager made with the SDK:
//
//	testEnv := &dispatchtest.Environment{Environment: envtest.Environment{CRDDirectoryPaths: paths}}
//	cfg, err := testEnv.Start()
//	defer testEnv.Stop()
//	mgr, err := ctrl.NewManager(cfg, ctrl.Options{NewClient: dispatch.NewClient, NewCache: dispatch.NewCache})
//	err = dispatch.ControllerManagedBy(mgr).For(&v1.Widget{}).Complete(reconciler)
//
// The binaries are found as envtest finds the API server's: in Options.BinaryAssetsDirectory,
// else in KUBE_DISPATCH_ASSETS, else (with Options.DownloadBinaryAssets) fetched from this
// SDK's release into a cache as setup-envtest fetches envtest's (DownloadBinaryAssets; the
// command setup-kube-dispatch does the same and prints the directory, for KUBE_DISPATCH_ASSETS),
// else on the PATH (kube-dispatch-dispatcher and kube-dispatch-loadbalancer, from the release
// of the SDK or built with cargo build --bins).
package dispatchtest

import (
	"bufio"
	"context"
	"errors"
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
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
)

// Binaries are the tier's binaries, by the names their releases give them.
const (
	DispatcherBinary   = "kube-dispatch-dispatcher"
	LoadBalancerBinary = "kube-dispatch-loadbalancer"
)

// Options say how the tier runs. The zero value runs one dispatcher with its Leases in
// namespace default, its logs in a temporary directory.
type Options struct {
	// Dispatchers is how many dispatchers run (1 when 0).
	Dispatchers int
	// LeaseNamespace holds the dispatchers' Leases ("default" when empty); it must exist.
	LeaseNamespace string
	// BinaryAssetsDirectory holds the binaries; else KUBE_DISPATCH_ASSETS, else (with
	// DownloadBinaryAssets) the release of this SDK's version fetched into the cache, else
	// the PATH.
	BinaryAssetsDirectory string
	// DownloadBinaryAssets fetches the binaries of this SDK's release (dispatch.Version) when
	// neither BinaryAssetsDirectory nor KUBE_DISPATCH_ASSETS names them, and keeps them in
	// AssetsCacheDirectory for the next run (DownloadBinaryAssets, the function).
	DownloadBinaryAssets bool
	// BinaryAssetsURL is where releases publish their assets: KUBE_DISPATCH_ASSETS_URL, else
	// DefaultBinaryAssetsURL, when empty.
	BinaryAssetsURL string
	// LogDirectory receives each process's log (a temporary directory when empty).
	LogDirectory string
	// Env is added to the environment every process starts with, which holds KUBECONFIG and
	// the tier's own KD_ flags and nothing of this process's (see each binary's --help).
	Env []string
	// Ready bounds the wait for the tier to serve (60 s when 0).
	Ready time.Duration
}

// Process is one process of the tier.
type Process struct {
	Name string
	// Listen is its gRPC address, Admin its admin endpoint's (metrics, probes).
	Listen, Admin string
	// Log is the path of its log.
	Log    string
	Binary string
	Env    []string
	cmd    *exec.Cmd
	// exited is closed once the running process has been waited for.
	exited chan struct{}
	// logFrom is the size of the log when the running process started.
	logFrom int64
}

// Tier is a running tier.
type Tier struct {
	Dispatchers  []*Process
	LoadBalancer *Process
	// Others are the processes started with Run.
	Others []*Process
	logs   string
	// ownLogs says the log directory is the tier's own, removed by Stop.
	ownLogs bool
	// restore puts back the environment Start changed.
	restore []func()
}

// Start writes a kubeconfig for config, runs the dispatchers and a load balancer against its
// API server, and waits until the load balancer leads and knows them all and each dispatcher
// serves its share. It then points the controllers this process builds at the tier, as a
// Deployment's environment would: KD_LOADBALANCER is the load balancer's address, and
// KD_INSECURE and KD_ALLOW_ANONYMOUS say the tier is plaintext and takes no token.
func Start(config *rest.Config, options Options) (*Tier, error) {
	tier, err := New(options)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := tier.writeKubeconfig(config)
	if err != nil {
		tier.Stop()
		return nil, err
	}
	env := append([]string{"KUBECONFIG=" + kubeconfig, "KD_INSECURE=1", "KD_ALLOW_ANONYMOUS=1"}, options.Env...)
	if err := tier.Launch(options, env); err != nil {
		tier.Stop()
		return nil, err
	}
	for name, value := range map[string]string{"KD_LOADBALANCER": tier.LoadBalancer.Listen, "KD_INSECURE": "1", "KD_ALLOW_ANONYMOUS": "1"} {
		previous, had := os.LookupEnv(name)
		tier.restore = append(tier.restore, func() {
			if had {
				_ = os.Setenv(name, previous)
			} else {
				_ = os.Unsetenv(name)
			}
		})
		if err := os.Setenv(name, value); err != nil {
			tier.Stop()
			return nil, err
		}
	}
	return tier, nil
}

// New is a tier with nothing running yet, its log directory made: Launch starts it.
func New(options Options) (*Tier, error) {
	tier := &Tier{logs: options.LogDirectory}
	if tier.logs == "" {
		dir, err := os.MkdirTemp("", "dispatchtest-")
		if err != nil {
			return nil, err
		}
		tier.logs, tier.ownLogs = dir, true
	}
	return tier, nil
}

// Launch starts the processes with env (the kubeconfig and the security flags among it)
// and waits until they serve.
func (tier *Tier) Launch(options Options, env []string) error {
	n, namespace := max(options.Dispatchers, 1), options.LeaseNamespace
	if namespace == "" {
		namespace = "default"
	}
	common := append([]string{"KD_LOG_JSON=1"}, env...)
	if options.BinaryAssetsDirectory == "" && os.Getenv("KUBE_DISPATCH_ASSETS") == "" && options.DownloadBinaryAssets {
		fetched, err := DownloadBinaryAssets(context.Background(), options.BinaryAssetsURL, "")
		if err != nil {
			return err
		}
		options.BinaryAssetsDirectory = fetched
	}
	for i := range n {
		p, err := tier.process(options, fmt.Sprintf("dispatcher-%d", i), DispatcherBinary)
		if err != nil {
			return err
		}
		p.Env = append(append([]string(nil), common...),
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
	lb, err := tier.process(options, "loadbalancer", LoadBalancerBinary)
	if err != nil {
		return err
	}
	lb.Env = append(append([]string(nil), common...),
		"KD_LISTEN="+lb.Listen,
		"KD_ADMIN_LISTEN="+lb.Admin,
		"KD_NAMESPACE="+namespace,
		"KD_LEASE_DURATION=4s",
		"KD_LEASE_GRACE=1s",
		"KD_DISPATCHER_GRACE=1s",
		"KD_REPLICA_GRACE=3s",
	)
	tier.LoadBalancer = lb
	for _, p := range append(append([]*Process(nil), tier.Dispatchers...), lb) {
		if err := tier.run(p); err != nil {
			return err
		}
	}
	ready := options.Ready
	if ready == 0 {
		ready = 60 * time.Second
	}
	return tier.WaitReady(n, ready)
}

// process is a process of binary, on free loopback addresses.
func (tier *Tier) process(options Options, name, binary string) (*Process, error) {
	path, err := FindBinary(options.BinaryAssetsDirectory, binary)
	if err != nil {
		return nil, err
	}
	listen, err := FreeAddress()
	if err != nil {
		return nil, err
	}
	admin, err := FreeAddress()
	if err != nil {
		return nil, err
	}
	return &Process{Name: name, Binary: path, Listen: listen, Admin: admin}, nil
}

// FindBinary is the path of name: in dir, else in KUBE_DISPATCH_ASSETS, else on the PATH.
func FindBinary(dir, name string) (string, error) {
	for _, d := range []string{dir, os.Getenv("KUBE_DISPATCH_ASSETS")} {
		if d == "" {
			continue
		}
		path := filepath.Join(d, name)
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("dispatchtest: no %s in %s: %w", name, d, err)
		}
		return path, nil
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("dispatchtest: %s is not on the PATH: install the tier's binaries of this SDK's release (%s), or build them with cargo build --bins, and set Options.BinaryAssetsDirectory or KUBE_DISPATCH_ASSETS to their directory", name, dispatch.Version)
	}
	return path, nil
}

// DispatchOptions are the SDK options of a controller group on this tier: its load balancer,
// in plaintext.
func (tier *Tier) DispatchOptions(group string) dispatch.Options {
	return dispatch.Options{Group: group, LoadBalancer: tier.LoadBalancer.Listen, Credentials: &dispatch.Credentials{}}
}

// writeKubeconfig writes config as a kubeconfig in the log directory. A config that
// authenticates by an exec plugin or an auth provider, or impersonates, is refused: the
// processes could not do as it says.
func (tier *Tier) writeKubeconfig(config *rest.Config) (string, error) {
	if config.ExecProvider != nil || config.AuthProvider != nil || config.Impersonate.UserName != "" {
		return "", errors.New("dispatchtest: the rest.Config authenticates by an exec plugin or an auth provider, or impersonates: give the tier one with a client certificate or a token, as envtest's is")
	}
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters["tier"] = &clientcmdapi.Cluster{
		Server:                   config.Host,
		CertificateAuthorityData: config.CAData,
		CertificateAuthority:     config.CAFile,
		InsecureSkipTLSVerify:    config.Insecure,
		TLSServerName:            config.ServerName,
	}
	kubeconfig.AuthInfos["tier"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: config.CertData,
		ClientCertificate:     config.CertFile,
		ClientKeyData:         config.KeyData,
		ClientKey:             config.KeyFile,
		Token:                 config.BearerToken,
		TokenFile:             config.BearerTokenFile,
		Username:              config.Username,
		Password:              config.Password,
	}
	kubeconfig.Contexts["tier"] = &clientcmdapi.Context{Cluster: "tier", AuthInfo: "tier"}
	kubeconfig.CurrentContext = "tier"
	path := filepath.Join(tier.logs, "kubeconfig")
	return path, clientcmd.WriteToFile(*kubeconfig, path)
}

// run starts p, its output in its log.
func (tier *Tier) run(p *Process) error {
	if p.Log == "" {
		p.Log = filepath.Join(tier.logs, p.Name+".log")
	}
	out, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	p.logFrom = 0
	if info, err := out.Stat(); err == nil {
		p.logFrom = info.Size()
	}
	cmd := exec.Command(p.Binary)
	cmd.Env = p.Env
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("dispatchtest: cannot start %s: %w", p.Binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = out.Close(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	return nil
}

// Run starts another process beside the tier (a controller replica of another SDK, say) from
// the binary at path, with env as its whole environment; Stop stops it with the tier.
func (tier *Tier) Run(name, path string, env ...string) (*Process, error) {
	p := &Process{Name: name, Binary: path, Env: env}
	tier.Others = append(tier.Others, p)
	return p, tier.run(p)
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
func (tier *Tier) Restart(p *Process) error { return tier.run(p) }

// SetEnv sets name to value in p's environment (a KD_ flag, say) for its next start: a
// process Kill stopped and Restart starts again with other settings, as an upgrade that
// changes a flag would.
func (p *Process) SetEnv(name, value string) { p.Env = withEnv(p.Env, name, value) }

// Stop stops every process gracefully (SIGTERM), killing those still running after 10 s,
// removes the logs unless Options.LogDirectory named where they go, and puts back the
// environment Start changed.
func (tier *Tier) Stop() {
	all := tier.all()
	for _, p := range all {
		if p.cmd != nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range all {
		if p.cmd == nil {
			continue
		}
		select {
		case <-p.exited:
			p.cmd = nil
		case <-time.After(time.Until(deadline)):
		}
		tier.Kill(p)
	}
	if tier.ownLogs {
		_ = os.RemoveAll(tier.logs)
	}
	for _, restore := range tier.restore {
		restore()
	}
	tier.restore = nil
}

func (tier *Tier) all() []*Process {
	all := append(append([]*Process(nil), tier.Others...), tier.Dispatchers...)
	if tier.LoadBalancer != nil {
		all = append(all, tier.LoadBalancer)
	}
	return all
}

// Tails are the last n lines of each process's log, for a failed test's output.
func (tier *Tier) Tails(n int) string {
	var b strings.Builder
	for _, p := range tier.all() {
		fmt.Fprintf(&b, "%s log %s, its last lines:\n%s\n", p.Name, p.Log, tail(p.Log, n))
	}
	return b.String()
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

// WaitReady waits, at most within, until the load balancer leads and knows n dispatchers and
// every running dispatcher is ready and serving its share of a ring of n.
func (tier *Tier) WaitReady(n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	rebound := 0
	for {
		for _, p := range append(append([]*Process(nil), tier.Dispatchers...), tier.LoadBalancer) {
			if rebound < 5 {
				again, err := tier.rebindIfTaken(p)
				if err != nil {
					return err
				}
				if again {
					rebound++
				}
			}
		}
		lb := tier.LoadBalancer.Admin
		ready := Metric(lb, "kube_dispatch_lb_leader") == 1 && Metric(lb, "kube_dispatch_lb_dispatchers") == float64(n)
		for _, d := range tier.Dispatchers {
			if d.cmd == nil {
				continue
			}
			ready = ready && Metric(d.Admin, "kube_dispatch_ring_members") == float64(n) &&
				Metric(d.Admin, "kube_dispatch_ring_serving") == 1 && status(d.Admin, "/readyz") == http.StatusOK
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dispatchtest: the tier was not ready within %v (load balancer: leader %v, dispatchers %v of %d)\n%s",
				within, Metric(lb, "kube_dispatch_lb_leader"), Metric(lb, "kube_dispatch_lb_dispatchers"), n, tier.Tails(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rebindIfTaken starts p again on fresh addresses if it exited because one of its addresses
// was taken (FreeAddress finds addresses free only when it looks: a process of a test running
// beside this one may bind one first); returns whether it did.
func (tier *Tier) rebindIfTaken(p *Process) (bool, error) {
	if p.cmd == nil {
		return false, nil
	}
	select {
	case <-p.exited:
	default:
		return false, nil
	}
	data, err := os.ReadFile(p.Log)
	if err != nil || int64(len(data)) < p.logFrom ||
		!strings.Contains(string(data[p.logFrom:]), "Address already in use") {
		return false, nil
	}
	listen, err := FreeAddress()
	if err != nil {
		return false, err
	}
	admin, err := FreeAddress()
	if err != nil {
		return false, err
	}
	p.Listen, p.Admin = listen, admin
	p.Env = withEnv(withEnv(p.Env, "KD_LISTEN", p.Listen), "KD_ADMIN_LISTEN", p.Admin)
	p.cmd = nil
	return true, tier.run(p)
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

// Metric is the sum of the samples of name on the admin endpoint at admin (-1 when it cannot
// be read).
func Metric(admin, name string) float64 {
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

// FreeAddress is a loopback address with a port free now.
func FreeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}
