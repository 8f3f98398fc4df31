// The ported example controllers in one manager, as a kubebuilder project's cmd/main.go
// registers its reconcilers: the Bundle controller (examples/bundles/ported: owned ConfigMaps
// found through a field index, a status, a requeue after a minute) and the Mirror controller
// (examples/mirrors/ported: a finalizer, events, a referenced ConfigMap). Each is a controller
// group of its own on the tier (bundle, mirror). What differs from a manager on an informer
// cache is the manager's NewClient and NewCache, and no leader election: run as many replicas
// as you like.
//
//	kubectl apply -f examples/bundles/config/crd -f examples/mirrors/config/crd
//	KD_LOADBALANCER=127.0.0.1:7071 KD_INSECURE=1 KD_ALLOW_ANONYMOUS=1 go run ./examples/ported
//
// It runs in a pod as deploy/examples/ported-go shows; the environment is the SDK's (the
// configmap-hasher example's --help lists it).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	bundlesv1 "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/bundles/api/v1"
	bundles "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/bundles/ported"
	mirrorsv1 "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/mirrors/api/v1"
	mirrors "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/mirrors/ported"
)

const usage = `Usage: %s [flags]

Runs the Bundle and Mirror example controllers (examples.kube-dispatch.dev/v1) on the
kube-dispatch tier, each a controller group of its own: no informer cache, no leader election.
WATCH_NAMESPACE, when set, keeps both to that namespace. The rest of the environment is the
SDK's: KD_LOADBALANCER, KD_TLS_CA_FILE, KD_TLS_SERVER_NAME, KD_TOKEN_FILE, POD_NAME
(configmap-hasher-go --help says what each is).

Flags:
`

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), usage, os.Args[0])
		flag.PrintDefaults()
	}
	metrics := flag.String("metrics-bind-address", "0", "where /metrics is served (0: not served)")
	probes := flag.String("health-probe-bind-address", ":8081", "where /healthz and /readyz are served")
	logging := zap.Options{}
	logging.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&logging)))

	scheme := runtime.NewScheme()
	exitOn("cannot build the scheme", clientgoscheme.AddToScheme(scheme))
	exitOn("cannot build the scheme", bundlesv1.AddToScheme(scheme))
	exitOn("cannot build the scheme", mirrorsv1.AddToScheme(scheme))
	// A graceful stop waits for running reconciles, up to the dispatcher's maximum reconcile
	// time (60 s by default).
	shutdown := 60 * time.Second
	// WATCH_NAMESPACE keeps both controllers to one namespace, as operators built with
	// kubebuilder usually do; unset: every namespace.
	var cacheOptions cache.Options
	if namespace := os.Getenv("WATCH_NAMESPACE"); namespace != "" {
		cacheOptions.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Cache:                   cacheOptions,
		NewClient:               dispatch.NewClient,
		NewCache:                dispatch.NewCache,
		GracefulShutdownTimeout: &shutdown,
		Metrics:                 metricsserver.Options{BindAddress: *metrics},
		HealthProbeBindAddress:  *probes,
	})
	exitOn("cannot create the manager", err)
	exitOn("cannot create the Bundle controller", (&bundles.BundleReconciler{
		Client: mgr.GetClient(),
		Scheme: mgr.GetScheme(),
	}).SetupWithManager(mgr))
	exitOn("cannot create the Mirror controller", (&mirrors.MirrorReconciler{
		Client:   mgr.GetClient(),
		Scheme:   mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("mirror-controller"),
	}).SetupWithManager(mgr))
	exitOn("cannot add the health check", mgr.AddHealthzCheck("ping", healthz.Ping))
	// Ready once both controllers have a dispatcher session open.
	exitOn("cannot add the readiness check", mgr.AddReadyzCheck("kube-dispatch", dispatch.SessionsReady))
	exitOn("manager stopped", mgr.Start(ctrl.SetupSignalHandler()))
}

func exitOn(what string, err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, what+":", err)
		os.Exit(1)
	}
}
