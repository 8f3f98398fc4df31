package engine

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
//	kube_dispatch_stale_writes_total         counter  controller
//	kube_dispatch_api_requests_total         counter  controller, verb
//	kube_dispatch_objects_loaded_total       counter  controller, source
//	kube_dispatch_ready_to_reconcile_seconds histogram controller: from the key's becoming
//	                                         ready at the dispatcher to a worker taking it
//	                                         (buckets ReadyBuckets; not observed when the
//	                                         dispatcher does not say how long it waited: a
//	                                         resync or a list waits behind the changes by
//	                                         design, and older dispatchers say nothing)
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
	staleWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_dispatch_stale_writes_total",
		Help: "Writes of reconciles refused with 409 Conflict: the object changed since the version they were made against",
	}, []string{"controller"})
	apiRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_dispatch_api_requests_total",
		Help: "Requests NewClient's client sent to the API server, by verb and by the controller whose reconcile sent them (empty outside a reconcile)",
	}, []string{"controller", "verb"})

	objectsLoaded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_dispatch_objects_loaded_total",
		Help: "Objects handed to reconciles, by where they came from",
	}, []string{"controller", "source"})

	readyToReconcile = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kube_dispatch_ready_to_reconcile_seconds",
		Help:    "Time from the key's becoming ready at the dispatcher to its reconcile's start",
		Buckets: ReadyBuckets,
	}, []string{"controller"})

	registerOnce sync.Once
)

// ReadyBuckets are the Rust SDK's buckets of kube_dispatch_ready_to_reconcile_seconds, in
// seconds: round figures, so an SLO's threshold is one of them.
var ReadyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// controller-runtime's workqueue_* metrics. Its controller records them from its own work
// queue, which the SDK's queue replaces, so the SDK records them instead, in the same series:
// registering collectors described exactly as controller-runtime's (name, help and labels)
// hands back the ones it registered, the Prometheus client's way of sharing a collector. The
// series are labelled name and controller, both the controller's name, as controller-runtime
// labels them (depth also priority, empty here: the tier has none).
//
//	workqueue_depth                              deliveries waiting for a worker
//	workqueue_adds_total                         deliveries accepted
//	workqueue_queue_duration_seconds             from a delivery's arrival to its worker
//	workqueue_work_duration_seconds              from its worker to its ack
//	workqueue_unfinished_work_seconds            seconds of reconciles still running
//	workqueue_longest_running_processor_seconds  the longest of them
//	workqueue_retries_total                      deliveries of a retry or requeue
var (
	queueDepth = sharedVec(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: "workqueue", Name: "depth",
		Help: "Current depth of workqueue by workqueue and priority",
	}, []string{"name", "controller", "priority"}))
	queueAdds = sharedVec(prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "workqueue", Name: "adds_total",
		Help: "Total number of adds handled by workqueue",
	}, []string{"name", "controller"}))
	queueLatency = sharedVec(queueHistogram("queue_duration_seconds",
		"How long in seconds an item stays in workqueue before being requested"))
	queueWork = sharedVec(queueHistogram("work_duration_seconds",
		"How long in seconds processing an item from workqueue takes."))
	queueUnfinished = sharedVec(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: "workqueue", Name: "unfinished_work_seconds",
		Help: "How many seconds of work has been done that " +
			"is in progress and hasn't been observed by work_duration. Large " +
			"values indicate stuck threads. One can deduce the number of stuck " +
			"threads by observing the rate at which this increases.",
	}, []string{"name", "controller"}))
	queueLongest = sharedVec(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: "workqueue", Name: "longest_running_processor_seconds",
		Help: "How many seconds has the longest running " +
			"processor for workqueue been running.",
	}, []string{"name", "controller"}))
	queueRetries = sharedVec(prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "workqueue", Name: "retries_total",
		Help: "Total number of items added to the workqueue with a non-zero delay (rate-limited requeues, explicit RequeueAfter or AddAfter calls)",
	}, []string{"name", "controller"}))
)

// queueHistogram is a workqueue histogram as controller-runtime describes its two.
func queueHistogram(name, help string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem:                       "workqueue",
		Name:                            name,
		Help:                            help,
		Buckets:                         prometheus.ExponentialBuckets(10e-9, 10, 12),
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  100,
		NativeHistogramMinResetDuration: time.Hour,
	}, []string{"name", "controller"})
}

// sharedVec is the collector registered in controller-runtime's registry under vec's
// description: controller-runtime's own when it registered one, else vec, registered now. A
// description that differs from controller-runtime's (another release changed it) leaves vec
// unregistered: the SDK's queue then records figures nobody scrapes, and sharedVecErr says
// why.
func sharedVec[V prometheus.Collector](vec V) V {
	err := metrics.Registry.Register(vec)
	var already prometheus.AlreadyRegisteredError
	switch {
	case err == nil:
		return vec
	case errors.As(err, &already):
		if existing, ok := already.ExistingCollector.(V); ok {
			return existing
		}
	}
	sharedVecErrs = append(sharedVecErrs, err)
	return vec
}

// sharedVecErrs are the reasons a workqueue metric could not join controller-runtime's.
var sharedVecErrs []error

// WorkqueueMetricsError says why the SDK's queue records workqueue_* series that
// controller-runtime's registry does not serve (nil when it serves them all).
func WorkqueueMetricsError() error { return errors.Join(sharedVecErrs...) }

// queueMetrics records one controller's workqueue_* series.
type queueMetrics struct {
	depth                      prometheus.Gauge
	adds, retries              prometheus.Counter
	latency, work              prometheus.Observer
	unfinished, longestRunning prometheus.Gauge
}

func newQueueMetrics(name string) queueMetrics {
	return queueMetrics{
		depth:          queueDepth.WithLabelValues(name, name, ""),
		adds:           queueAdds.WithLabelValues(name, name),
		retries:        queueRetries.WithLabelValues(name, name),
		latency:        queueLatency.WithLabelValues(name, name),
		work:           queueWork.WithLabelValues(name, name),
		unfinished:     queueUnfinished.WithLabelValues(name, name),
		longestRunning: queueLongest.WithLabelValues(name, name),
	}
}

// register adds the SDK's metrics to controller-runtime's registry once per process.
func register() {
	registerOnce.Do(func() {
		for _, c := range []prometheus.Collector{sessionsOpen, sessionReconnects, fencedReconciles, deliveries, staleWrites, apiRequests, objectsLoaded, readyToReconcile} {
			if err := metrics.Registry.Register(c); err != nil {
				var already prometheus.AlreadyRegisteredError
				if !errors.As(err, &already) {
					panic(err)
				}
			}
		}
	})
}

// Metrics records one controller's figures: the SDK's labelled with its group, the
// workqueue's with its name (as controller-runtime labels its own).
type Metrics struct {
	Controller string
	queue      queueMetrics
	ready      prometheus.Observer
	// Open counts the controller's sessions open now (SessionsReady).
	Open atomic.Int64
}

func NewMetrics(group, name string) *Metrics {
	register()
	return &Metrics{Controller: group, queue: newQueueMetrics(name), ready: readyToReconcile.WithLabelValues(group)}
}

func (m *Metrics) delivered(reason pb.Reason) {
	deliveries.WithLabelValues(m.Controller, ReasonLabel(reason)).Inc()
}

// ReasonLabel is a reason as the metrics and dispatch.Delivery say it: "added", "owned" and so on.
func ReasonLabel(reason pb.Reason) string {
	return strings.ToLower(strings.TrimPrefix(reason.String(), "REASON_"))
}

func (m *Metrics) SessionOpened(dispatcher string) func() {
	gauge := sessionsOpen.WithLabelValues(m.Controller, dispatcher)
	gauge.Inc()
	m.Open.Add(1)
	return func() {
		gauge.Dec()
		m.Open.Add(-1)
	}
}

func (m *Metrics) reconnecting() { sessionReconnects.WithLabelValues(m.Controller).Inc() }

// Loaded counts the delivered object a reconcile's Get was served from source: "request" (its
// body, or NotFound for a deletion), "recent" (as a reconcile here was given it, at the same
// version) or "read" (the API server).
func (m *Metrics) Loaded(source string) {
	objectsLoaded.WithLabelValues(m.Controller, source).Inc()
}

// CountAPIRequest counts a request NewClient's client sent to the API server, by the
// controller whose reconcile sent it (empty outside a reconcile) and its verb.
func CountAPIRequest(controller, verb string) {
	register()
	apiRequests.WithLabelValues(controller, verb).Inc()
}

func (m *Metrics) StaleWrite() { staleWrites.WithLabelValues(m.Controller).Inc() }

func (m *Metrics) fenced() { fencedReconciles.WithLabelValues(m.Controller).Inc() }
