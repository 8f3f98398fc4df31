package dispatch

import (
	"errors"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// The SDK's own metrics, beside controller-runtime's (controller_runtime_reconcile_total and
// the rest, which its controller records as it runs each reconcile), in controller-runtime's
// registry so the manager's metrics server serves them. Names and labels are the Rust SDK's:
//
//	kube_dispatch_sessions                   gauge    controller, dispatcher
//	kube_dispatch_session_reconnects_total   counter  controller
//	kube_dispatch_fenced_reconciles_total    counter  controller
//	kube_dispatch_deliveries_total           counter  controller, reason
//
// No label names a key or an object, so the series stay few however many objects there are.
var (
	sessionsOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kube_dispatch_sessions",
		Help: "Dispatcher sessions open, per controller and dispatcher",
	}, []string{"controller", "dispatcher"})
	sessionReconnects = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_dispatch_session_reconnects_total",
		Help: "Dispatcher sessions lost and opened again",
	}, []string{"controller"})
	fencedReconciles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_dispatch_fenced_reconciles_total",
		Help: "Reconciles cancelled because their session could not be renewed in time",
	}, []string{"controller"})
	deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_dispatch_deliveries_total",
		Help: "Reconcile requests received, by reason",
	}, []string{"controller", "reason"})

	registerOnce sync.Once
)

// register adds the SDK's metrics to controller-runtime's registry once per process.
func register() {
	registerOnce.Do(func() {
		for _, c := range []prometheus.Collector{sessionsOpen, sessionReconnects, fencedReconciles, deliveries} {
			if err := metrics.Registry.Register(c); err != nil {
				var already prometheus.AlreadyRegisteredError
				if !errors.As(err, &already) {
					panic(err)
				}
			}
		}
	})
}

// sdkMetrics records one controller's figures.
type sdkMetrics struct {
	controller string
}

func newMetrics(controller string) *sdkMetrics {
	register()
	return &sdkMetrics{controller: controller}
}

func (m *sdkMetrics) delivered(reason pb.Reason) {
	deliveries.WithLabelValues(m.controller, reasonLabel(reason)).Inc()
}

// reasonLabel is a reason as the metrics and Delivery say it: "added", "owned" and so on.
func reasonLabel(reason pb.Reason) string {
	return strings.ToLower(strings.TrimPrefix(reason.String(), "REASON_"))
}

func (m *sdkMetrics) sessionOpened(dispatcher string) func() {
	gauge := sessionsOpen.WithLabelValues(m.controller, dispatcher)
	gauge.Inc()
	return func() { gauge.Dec() }
}

func (m *sdkMetrics) reconnecting() { sessionReconnects.WithLabelValues(m.controller).Inc() }

func (m *sdkMetrics) fenced() { fencedReconciles.WithLabelValues(m.controller).Inc() }
