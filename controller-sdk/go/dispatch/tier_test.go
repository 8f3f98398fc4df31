package dispatch_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	example "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/examples/configmap-hasher/hasher"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/scrape"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/tiertest"
)

func TestMain(m *testing.M) {
	// controller-runtime wants a logger set; the tests judge by outcomes, not logs.
	ctrl.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// hasher runs the example's ConfigMap hasher (examples/configmap-hasher/hasher), recording
// every reconcile, by replica, and any reconcile of a key that began while another (in any
// replica) had not ended; with hold, each reconcile first waits that long (its context ending
// the wait).
type hasher struct {
	inner   reconcile.Reconciler
	replica string
	log     *reconcileLog
	hold    time.Duration
}

type reconcileLog struct {
	mu       sync.Mutex
	running  map[string]string
	overlaps []string
	byKey    map[string][]string
	// observe, when set, is told of each begin and end (the kill tests' replica processes
	// print them).
	observe func(what, key string)
	// cancelled counts reconciles whose context ended while they held.
	cancelled int
	// reasons are the delivery reasons of each key's reconciles, in order.
	reasons map[string][]string
}

func newLog() *reconcileLog {
	return &reconcileLog{running: map[string]string{}, byKey: map[string][]string{}, reasons: map[string][]string{}}
}

func (l *reconcileLog) reason(key, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reasons[key] = append(l.reasons[key], reason)
}

func (l *reconcileLog) reasonsOf(key string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.reasons[key]...)
}

func (l *reconcileLog) begin(key, replica string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if other, busy := l.running[key]; busy {
		l.overlaps = append(l.overlaps, fmt.Sprintf("%s: %s began while %s ran", key, replica, other))
	}
	l.running[key] = replica
	l.byKey[key] = append(l.byKey[key], replica)
	if l.observe != nil {
		l.observe("begin", key)
	}
}

func (l *reconcileLog) end(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.running, key)
	if l.observe != nil {
		l.observe("end", key)
	}
}

func (l *reconcileLog) overlapsNow() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.overlaps...)
}

func (l *reconcileLog) replicas() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	count := map[string]int{}
	for _, replicas := range l.byKey {
		for _, r := range replicas {
			count[r]++
		}
	}
	return count
}

func (h *hasher) Reconcile(ctx context.Context, request reconcile.Request) (reconcile.Result, error) {
	key := request.String()
	if d, ok := dispatch.DeliveryOf(ctx); ok {
		h.log.reason(key, d.Reason)
	}
	h.log.begin(key, h.replica)
	defer h.log.end(key)
	if h.hold > 0 {
		select {
		case <-time.After(h.hold):
		case <-ctx.Done():
			h.log.mu.Lock()
			h.log.cancelled++
			h.log.mu.Unlock()
			return reconcile.Result{}, context.Cause(ctx)
		}
	}
	return h.inner.Reconcile(ctx, request)
}

// setup is what a test may change of a replica before it starts.
type setup struct {
	manager manager.Manager
	builder *dispatch.Builder
	options *dispatch.Options
	// reconciler, when set, is reconciled instead of the example hasher (with the manager's
	// client).
	reconciler func(client.Client) reconcile.Reconciler
}

// replica runs one controller-runtime manager with the hasher on the tier, until stop is
// called; stop returns once the manager has shut down.
func replica(t *testing.T, config *rest.Config, tier *tiertest.Tier, group, id string, log *reconcileLog, hold time.Duration, extra ...func(*setup)) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		NewClient:              dispatch.NewClient,
		NewCache:               dispatch.NewCache,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	plaintext := dispatch.Credentials{}
	options := dispatch.Options{
		Group:        group,
		ReplicaID:    id,
		LoadBalancer: tier.LoadBalancer.Listen,
		Credentials:  &plaintext,
		Namespace:    tier.Namespace,
		SessionTTL:   4 * time.Second,
	}
	b := dispatch.ControllerManagedBy(mgr)
	change := setup{manager: mgr, builder: b, options: &options}
	for _, configure := range extra {
		configure(&change)
	}
	var inner reconcile.Reconciler = &example.Reconciler{Client: mgr.GetClient()}
	if change.reconciler != nil {
		inner = change.reconciler(mgr.GetClient())
	}
	err = b.
		For(&corev1.ConfigMap{}).
		Named(group + "-" + id).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: new(true)}).
		WithDispatchOptions(options).
		Complete(&hasher{inner: inner, replica: id, log: log, hold: hold})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("replica %s: %v", id, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("replica %s did not shut down within 30 s", id)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// converged waits until every ConfigMap of the namespace holds the hash of its data (and is
// current by each of also), failing after a minute with those that do not.
func converged(t *testing.T, clientset kubernetes.Interface, namespace string, want int, also ...func(corev1.ConfigMap) bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := clientset.CoreV1().ConfigMaps(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "test=go-sdk"})
		if err != nil {
			t.Fatal(err)
		}
		var behind []string
		for _, cm := range list.Items {
			current := cm.Annotations[example.Annotation] == example.Hash(cm.Data)
			for _, check := range also {
				current = current && check(cm)
			}
			if !current {
				behind = append(behind, cm.Name)
			}
		}
		if len(list.Items) == want && len(behind) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d ConfigMaps not reconciled after a minute: %s", len(behind), len(list.Items), strings.Join(behind, " "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func create(t *testing.T, clientset kubernetes.Interface, namespace string, n int) {
	t.Helper()
	for i := range n {
		_, err := clientset.CoreV1().ConfigMaps(namespace).Create(context.Background(), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i), Labels: map[string]string{"test": "go-sdk"}},
			Data:       map[string]string{"value": "0"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// change writes a new value into ConfigMap i (retrying a conflict with the controller's write).
func change(t *testing.T, clientset kubernetes.Interface, namespace string, i int, value string) {
	t.Helper()
	for {
		cms := clientset.CoreV1().ConfigMaps(namespace)
		cm, err := cms.Get(context.Background(), fmt.Sprintf("cm-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["value"] = value
		_, err = cms.Update(context.Background(), cm, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

// scene is a tier of dispatchers and objects ConfigMaps in a namespace of the test's own.
type scene struct {
	config    *rest.Config
	clientset kubernetes.Interface
	tier      *tiertest.Tier
	objects   int
}

func newScene(t *testing.T, dispatchers, objects int) *scene {
	t.Helper()
	config := tiertest.Config(t)
	clientset := kubernetes.NewForConfigOrDie(config)
	namespace := tiertest.Namespace(t, clientset)
	tier := tiertest.Start(t, namespace, dispatchers)
	create(t, clientset, namespace, objects)
	return &scene{config: config, clientset: clientset, tier: tier, objects: objects}
}

// converged waits until every object holds the hash of its data.
func (s *scene) converged(t *testing.T) {
	t.Helper()
	converged(t, s.clientset, s.tier.Namespace, s.objects)
}

// changeAll writes rounds of changes to every object, calling midway (if not nil) halfway
// through the second round.
func (s *scene) changeAll(t *testing.T, rounds int, midway func()) {
	t.Helper()
	for round := range rounds {
		for i := range s.objects {
			change(t, s.clientset, s.tier.Namespace, i, fmt.Sprintf("round-%d", round))
			if round == 1 && i == s.objects/2 && midway != nil {
				midway()
			}
		}
	}
}

// One Go replica on a tier of two dispatchers reconciles every object and every change, with
// its Reconciler unchanged from controller-runtime's shape, and shuts down gracefully.
func TestOneReplicaReconcilesEveryObjectAndChange(t *testing.T) {
	s := newScene(t, 2, 20)
	log := newLog()
	stop := replica(t, s.config, s.tier, "go-hasher", "go-0", log, 0)
	s.converged(t)
	if err := dispatch.SessionsReady(nil); err != nil {
		t.Fatalf("not ready while reconciling: %v", err)
	}
	for i := range 10 {
		change(t, s.clientset, s.tier.Namespace, i, "1")
	}
	s.converged(t)
	stop()
	if len(log.overlaps) > 0 {
		t.Fatalf("reconciles of one key overlapped: %v", log.overlaps)
	}
	reconciles := log.replicas()["go-0"]
	if reconciles < 30 {
		t.Fatalf("only %d reconciles for 20 objects and 10 changes", reconciles)
	}
	// controller-runtime's metrics count the reconciles as its own controller and queue would.
	name := map[string]string{"name": "go-hasher-go-0"}
	for metric, labels := range map[string]map[string]string{
		"controller_runtime_reconcile_total":        {"controller": "go-hasher-go-0", "result": "success"},
		"workqueue_adds_total":                      name,
		"workqueue_queue_duration_seconds":          name,
		"workqueue_work_duration_seconds":           name,
		"kube_dispatch_deliveries_total":            {"controller": "go-hasher"},
		"controller_runtime_reconcile_time_seconds": {"controller": "go-hasher-go-0"},
	} {
		if got := scrape.Sample(t, metric, labels); got != float64(reconciles) {
			t.Errorf("%s%v = %v, want %d (the reconciles)", metric, labels, got, reconciles)
		}
	}
	// Every reconcile of a change is in the tier's latency; the first list's 20, which wait
	// behind the changes by design, are not.
	if got := scrape.Sample(t, "kube_dispatch_ready_to_reconcile_seconds", map[string]string{"controller": "go-hasher"}); got != float64(reconciles-s.objects) {
		t.Errorf("kube_dispatch_ready_to_reconcile_seconds = %v, want %d (the reconciles but the first list's %d)", got, reconciles-s.objects, s.objects)
	}
	// Each object was read from its delivery, never from the API server; each change written once
	// at least (again after a conflict with the test's own write).
	for verb, limit := range map[string][2]float64{"get": {0, 0}, "list": {0, 0}, "watch": {0, 0}, "update": {30, float64(reconciles)}} {
		got := scrape.Sample(t, "kube_dispatch_api_requests_total", map[string]string{"controller": "go-hasher", "verb": verb})
		if got < limit[0] || got > limit[1] {
			t.Errorf("%s requests: %v, want %v to %v", verb, got, limit[0], limit[1])
		}
	}
	if got := scrape.Sample(t, "workqueue_depth", name); got != 0 {
		t.Errorf("workqueue_depth = %v once every delivery was reconciled", got)
	}
}

// Two Go replicas of one group share the objects, never reconcile one key at the same time,
// and when one stops gracefully while objects change, the other takes its keys and nothing
// is lost.
func TestTwoReplicasShareKeysAndNeverOverlap(t *testing.T) {
	s := newScene(t, 3, 30)
	log := newLog()
	stop0 := replica(t, s.config, s.tier, "go-pair", "go-0", log, 20*time.Millisecond)
	replica(t, s.config, s.tier, "go-pair", "go-1", log, 20*time.Millisecond)
	s.converged(t)
	s.changeAll(t, 3, stop0)
	s.converged(t)
	if found := log.overlapsNow(); len(found) > 0 {
		t.Fatalf("reconciles of one key overlapped: %v", found)
	}
	if counts := log.replicas(); counts["go-0"] == 0 || counts["go-1"] == 0 {
		t.Fatalf("the replicas did not share the keys: %v", counts)
	}
}

// A replica stopped gracefully while reconciles run: they finish (their context is not
// cancelled by the stop), their acks go out, and the objects they wrote are current.
func TestAGracefulStopLetsRunningReconcilesFinish(t *testing.T) {
	s := newScene(t, 1, 8)
	log := newLog()
	stop := replica(t, s.config, s.tier, "go-graceful", "go-0", log, 500*time.Millisecond)
	s.converged(t)
	for i := range s.objects {
		change(t, s.clientset, s.tier.Namespace, i, "1")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		log.mu.Lock()
		running := len(log.running)
		log.mu.Unlock()
		if running > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no reconcile started after the changes")
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	log.mu.Lock()
	defer log.mu.Unlock()
	if log.cancelled > 0 || len(log.running) > 0 {
		t.Fatalf("the stop cancelled %d reconciles; %d still running", log.cancelled, len(log.running))
	}
}

// ReconcileOn: a request sent on the channel reconciles an object that did not change, on the
// replica the dispatcher gives its key to, with reason "triggered"; ReconcileAllOn reconciles
// every object.
func TestReconcileOnReconcilesObjectsThatDidNotChange(t *testing.T) {
	s := newScene(t, 2, 6)
	log := newLog()
	requests := make(chan reconcile.Request)
	everything := make(chan struct{})
	replica(t, s.config, s.tier, "go-trigger", "go-0", log, 0, func(s *setup) {
		s.builder.ReconcileOn(requests).ReconcileAllOn(everything)
	})
	s.converged(t)
	key := func(i int) string { return fmt.Sprintf("%s/cm-%d", s.tier.Namespace, i) }
	triggered := func(i int) int {
		n := 0
		for _, r := range log.reasonsOf(key(i)) {
			if r == "triggered" {
				n++
			}
		}
		return n
	}
	waitFor := func(what string, done func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !done() {
			if time.Now().After(deadline) {
				t.Fatalf("%s within 30 s; reasons of cm-2: %v", what, log.reasonsOf(key(2)))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Each object's hash write comes back as a "modified" reconcile; a trigger sent while
	// that one still waits would rightly be coalesced into it (and carry its reason), so the
	// trigger is sent once every echo has been reconciled and nothing runs.
	waitFor("every object's own write reconciled", func() bool {
		for i := range s.objects {
			if !slices.Contains(log.reasonsOf(key(i)), "modified") {
				return false
			}
		}
		log.mu.Lock()
		defer log.mu.Unlock()
		return len(log.running) == 0
	})
	requests <- reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.tier.Namespace, Name: "cm-2"}}
	waitFor("cm-2 reconciled on its trigger", func() bool { return triggered(2) == 1 })
	if triggered(1) != 0 {
		t.Fatalf("cm-1 was triggered too: %v", log.reasonsOf(key(1)))
	}
	everything <- struct{}{}
	waitFor("every object reconciled on the trigger of all", func() bool {
		for i := range s.objects {
			if triggered(i) < 1 || (i == 2 && triggered(i) < 2) {
				return false
			}
		}
		return true
	})
}

// A change written while its key's reconcile runs is delivered once that reconcile has been
// acknowledged, to whichever replica, never beside it or into it: the replica acknowledges a
// delivery only when its reconcile returns.
func TestAChangeWaitsForItsKeysRunningReconcile(t *testing.T) {
	s := newScene(t, 1, 1)
	log := newLog()
	replica(t, s.config, s.tier, "go-wait", "go-0", log, 300*time.Millisecond)
	replica(t, s.config, s.tier, "go-wait", "go-1", log, 300*time.Millisecond)
	s.converged(t)
	key := s.tier.Namespace + "/cm-0"
	for round := range 4 {
		// Wait for a reconcile of the key to be running, then change the object under it.
		deadline := time.Now().Add(30 * time.Second)
		for {
			log.mu.Lock()
			_, running := log.running[key]
			log.mu.Unlock()
			if running {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no reconcile of %s running within 30 s", round, key)
			}
			time.Sleep(5 * time.Millisecond)
		}
		change(t, s.clientset, s.tier.Namespace, 0, fmt.Sprintf("under-%d", round))
	}
	s.converged(t)
	// Delivered before the running reconcile was acknowledged, a change would find its key
	// still running in that replica (refused, then a retry) or run beside it in the other.
	if reasons := log.reasonsOf(key); slices.Contains(reasons, "retry") {
		t.Fatalf("a change was delivered while its key's reconcile ran: reasons %v", reasons)
	}
	if found := log.overlapsNow(); len(found) > 0 {
		t.Fatalf("reconciles of one key overlapped: %v", found)
	}
}
