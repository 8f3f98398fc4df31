// The ConfigMap hasher on the kube-dispatch tier, in Go: keeps an annotation on every
// ConfigMap (of KD_WATCH_NAMESPACE, or of every namespace) equal to a hash of its data
// (package hasher). A controller-runtime Reconciler as any other; only the manager's client and
// the builder come from the SDK. Run as many replicas as you like: the dispatchers share the
// ConfigMaps among them, and a replica that dies is replaced by the others within the session
// ttl.
//
//	KD_LOADBALANCER=127.0.0.1:7071 KD_INSECURE=1 KD_ALLOW_ANONYMOUS=1 go run ./examples/configmap-hasher
//
// Flags: controller-runtime's logging flags (--zap-log-level=debug logs each reconcile's start
// and end with its key and dispatcher; at debug level controller-runtime drops lines of one
// message past 100 a second, at --zap-log-level=2 it keeps them all), --metrics-bind-address (/metrics) and
// --health-probe-bind-address (/healthz, and /readyz: a dispatcher session is open). It runs
// in a pod as deploy/examples/configmap-hasher-go shows.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/configmap-hasher/hasher"
)

const usage = `Usage: %s [flags]

Keeps the annotation example.kube-dispatch.dev/hash of every ConfigMap equal to a hash of its
data, as a replica of the controller group configmap-hasher-go on the kube-dispatch tier: no
informer cache, no leader election; run as many replicas as you like.

Flags:
`

const environment = `
Environment:
  KUBECONFIG                        the API server (in a pod: its ServiceAccount)
  KD_WATCH_NAMESPACE                reconcile this namespace only (default: all)
  POD_NAME                          this replica's id (default: host name and process id)
  KD_LOADBALANCER                   the load balancer (default
                                    kube-dispatch-loadbalancer.kube-dispatch.svc:7071)
  KD_TLS_CA_FILE                    CA bundle the tier's certificates chain to (default
                                    /var/run/secrets/kube-dispatch/ca.crt)
  KD_TLS_SERVER_NAME                name the dispatchers' certificate carries (default: the
                                    host of each address)
  KD_LOADBALANCER_TLS_SERVER_NAME   name the load balancer's certificate carries
  KD_TOKEN_FILE                     the projected token, audience kube-dispatch (default
                                    /var/run/secrets/kube-dispatch/token; read again as rotated)
  KD_INSECURE                       plaintext, for a tier started with --insecure (tests only)
  KD_ALLOW_ANONYMOUS                send no token, for a tier started with --allow-anonymous
`

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), usage, os.Args[0])
		flag.PrintDefaults()
		fmt.Fprint(flag.CommandLine.Output(), environment)
	}
	version := flag.Bool("version", false, "print the version (the kube-dispatch Go SDK's) and exit")
	metrics := flag.String("metrics-bind-address", "0", "where /metrics is served (0: not served)")
	probes := flag.String("health-probe-bind-address", ":8081", "where /healthz and /readyz are served")
	logging := zap.Options{}
	logging.BindFlags(flag.CommandLine)
	flag.Parse()
	if *version {
		fmt.Println("configmap-hasher-go", dispatch.Version)
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&logging)))
	// A graceful stop waits for running reconciles: at least the dispatcher's maximum
	// reconcile time (60 s by default).
	shutdown := 60 * time.Second
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		NewClient:               dispatch.NewClient,
		NewCache:                dispatch.NewCache,
		GracefulShutdownTimeout: &shutdown,
		Metrics:                 metricsserver.Options{BindAddress: *metrics},
		HealthProbeBindAddress:  *probes,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create the manager:", err)
		os.Exit(1)
	}
	err = dispatch.ControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		Named("configmap-hasher-go").
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		WithDispatchOptions(dispatch.Options{Namespace: os.Getenv("KD_WATCH_NAMESPACE")}).
		Complete(&hasher.Reconciler{Client: mgr.GetClient()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create the controller:", err)
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		fmt.Fprintln(os.Stderr, "cannot add the health check:", err)
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("kube-dispatch", dispatch.SessionsReady); err != nil {
		fmt.Fprintln(os.Stderr, "cannot add the readiness check:", err)
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, "manager stopped:", err)
		os.Exit(1)
	}
}
