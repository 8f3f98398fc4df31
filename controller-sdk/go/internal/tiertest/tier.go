// Package tiertest starts a real kube-dispatch tier for the SDK's tests: dispatcher and load
// balancer processes (the binaries `cargo build --bins` made) against the local API server the
// project's scripts start (tests/cluster/cluster.sh), on loopback, with plaintext and no
// tokens, or secured as deployed (Options.Secure). Each test gets a namespace of its own,
// deleted when it ends.
package tiertest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatchtest"
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
type Process = dispatchtest.Process

// Tier is a running tier, stopped when its test ends.
type Tier struct {
	*dispatchtest.Tier
	t         testing.TB
	Namespace string
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
	inner, err := dispatchtest.New(dispatchtest.Options{LogDirectory: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tier := &Tier{Tier: inner, t: t, Namespace: namespace}
	env := []string{"KUBECONFIG=" + Kubeconfig()}
	if options.Secure {
		pki := filepath.Join(ClusterDir(), "pki")
		env = append(env,
			"KD_TLS_CERT_FILE="+filepath.Join(pki, "kube-dispatch.crt"),
			"KD_TLS_KEY_FILE="+filepath.Join(pki, "kube-dispatch.key"),
			"KD_TLS_CA_FILE="+filepath.Join(pki, "ca.crt"),
			"KD_TOKEN_FILE="+filepath.Join(ClusterDir(), "tokens", "tester.token"),
			"KD_PEER_USERS="+Tester,
		)
	} else {
		env = append(env, "KD_INSECURE=1", "KD_ALLOW_ANONYMOUS=1")
	}
	t.Cleanup(tier.stop)
	launch := dispatchtest.Options{Dispatchers: n, LeaseNamespace: namespace, BinaryAssetsDirectory: binaries()}
	if err := inner.Launch(launch, append(env, options.Env...)); err != nil {
		t.Fatal(err)
	}
	return tier
}

// Run starts another process of the test (a controller replica of another SDK, say) from the
// binary cargo built at path (under target/debug, such as "examples/configmap_hasher"), with
// env as its whole environment; it is stopped with the tier.
func (tier *Tier) Run(name, path string, env ...string) *Process {
	tier.t.Helper()
	binary := filepath.Join(binaries(), path)
	if _, err := os.Stat(binary); err != nil {
		tier.t.Fatalf("no %s: build it with cargo build (or set KD_BIN_DIR)", binary)
	}
	p, err := tier.Tier.Run(name, binary, env...)
	if err != nil {
		tier.t.Fatal(err)
	}
	return p
}

// Restart starts p again at the same addresses.
func (tier *Tier) Restart(p *Process) {
	tier.t.Helper()
	if err := tier.Tier.Restart(p); err != nil {
		tier.t.Fatal(err)
	}
}

// WaitReady waits until the load balancer leads and knows n dispatchers and every running
// dispatcher is ready and serving its share of a ring of n.
func (tier *Tier) WaitReady(n int) {
	tier.t.Helper()
	if err := tier.Tier.WaitReady(n, 60*time.Second); err != nil {
		tier.t.Fatal(err)
	}
}

// stop stops the processes; when the test failed, the ends of their logs (in the test's
// temporary folder, removed once it ends) go into its output first.
func (tier *Tier) stop() {
	tier.Stop()
	if tier.t.Failed() {
		tier.t.Log(tier.Tails(40))
	}
}

// Metric is the sum of the samples of name on the admin endpoint at admin (-1 when it cannot
// be read).
func Metric(admin, name string) float64 { return dispatchtest.Metric(admin, name) }

// binaries is where cargo built the tier's binaries: KD_BIN_DIR, else target/debug.
func binaries() string {
	if dir := os.Getenv("KD_BIN_DIR"); dir != "" {
		return dir
	}
	if target := os.Getenv("CARGO_TARGET_DIR"); target != "" {
		return filepath.Join(target, "debug")
	}
	return filepath.Join(Root(), "target", "debug")
}
