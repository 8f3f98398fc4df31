// The benchmark controller on controller-runtime, the incumbent most Kubernetes controllers are
// written with: the same reconcile as bench-controller (src/bin/bench-controller.rs) keeps the
// content-hash annotation on every object of one namespace (or of every namespace, selected by
// label), and prints the same
// "reconcile <micros> <namespace>/<name> <resourceVersion>" line on stdout when a reconcile
// starts, which is how the harness sees what ran when.
//
// Two ways, as controller-runtime offers them: the default cache of whole objects, or
// --metadata (builder.OnlyMetadata: a metadata-only cache; reconciles GET the object from the
// API server, as a metadata-only controller must).
//
// With --children C (records only), each Record also owns C ConfigMaps holding the hash of its
// data, as bench-controller's --children does: Owns(ConfigMap), each child read from the
// cache, applied when it differs. With --selector, the cache selects the children by it too
// (DefaultLabelSelector), so they carry their owner's label. With --children-from index, a
// reconcile finds its children as kubebuilder controllers do: one List through a field index on
// their controller (IndexField, MatchingFields), which the cache serves, or on the tier the Go
// SDK (dispatch.NewCache) by one LIST of the namespace from the API server's watch cache.
//
// With --leader-elect, the shape controller-runtime controllers run in production: two or more
// replicas, one leading through the Lease "bench-controller-runtime" in the objects' namespace
// (the manager's defaults: 15 s duration, 10 s renew deadline, 2 s retry), given up on a clean
// stop (LeaderElectionReleaseOnCancel, which kubebuilder's scaffold leaves commented out: with
// it a rollout's standby leads after one retry instead of after the Lease runs out), the
// standby cold unless --warmup (EnableWarmup: it starts its sources, a full cache, before it
// leads). Every process prints "ready" on stdout once its manager runs what needs no leader
// (the readiness probe of a controller-runtime pod passes about then).
//
// Built by build.sh with the machine's Go at the versions in go.mod.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The annotation the benchmark controller keeps equal to the hash of the object's data
// (kube_dispatch_bench::ANNOTATION).
const annotation = "bench.kube-dispatch.dev/content-hash"

// What a Record's children carry (kube_dispatch_bench::CHILD_LABEL, CHILD_HASH_KEY), and the
// label of a run spread over namespaces, which children copy from their owner
// (kube_dispatch_bench::SET_LABEL): the cache selects children by it too.
const (
	childLabel   = "bench.kube-dispatch.dev/owner"
	childHashKey = "owner-hash"
	setLabel     = "kube-dispatch.dev/bench-set"
)

var recordGVK = schema.GroupVersionKind{Group: "bench.kube-dispatch.dev", Version: "v1", Kind: "Record"}

// contentHash is kube_dispatch_bench::content_hash: SHA-256 over each key and value, sorted by
// key, each followed by a zero byte, in lowercase hex.
func contentHash(data map[string]string) string {
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write([]byte(data[k]))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

type reconciler struct {
	client   client.Client
	reader   client.Reader
	kind     string
	metadata bool
	children int
	// byIndex lists the children through the ownerIndex field index, instead of reading each.
	byIndex bool
}

func (r *reconciler) newObject() client.Object {
	if r.kind == "record" {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(recordGVK)
		return u
	}
	return &corev1.ConfigMap{}
}

func (r *reconciler) content(obj client.Object) map[string]string {
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		return o.Data
	case *unstructured.Unstructured:
		data, _, _ := unstructured.NestedStringMap(o.Object, "spec", "data")
		return data
	}
	return nil
}

// startLines gathers the reconcile-start lines for writeStarts, which writes them at most once a
// millisecond: a write per reconcile cost the process a system call and the harness a wake-up
// each. A line carries the time its reconcile started, so when it is written changes nothing
// measured. Past 1 MiB waiting, a reconcile writes them itself, held back by a slow reader as a
// write per line was.
var startLines = struct {
	sync.Mutex
	pending []byte
	writing sync.Mutex
	arrived chan struct{}
}{arrived: make(chan struct{}, 1)}

func started(key types.NamespacedName, resourceVersion string) {
	startLines.Lock()
	wasEmpty := len(startLines.pending) == 0
	startLines.pending = fmt.Appendf(startLines.pending, "reconcile %d %s/%s %s\n", time.Now().UnixMicro(), key.Namespace, key.Name, resourceVersion)
	full := len(startLines.pending) >= 1<<20
	startLines.Unlock()
	if full {
		flushStarts()
	} else if wasEmpty {
		select {
		case startLines.arrived <- struct{}{}:
		default:
		}
	}
}

func init() { go writeStarts() }

// writeStarts writes the lines waiting a millisecond after the first of them arrived.
func writeStarts() {
	for range startLines.arrived {
		time.Sleep(time.Millisecond)
		flushStarts()
	}
}

// flushStarts writes every line waiting, in order; a closed stdout means the harness is gone.
func flushStarts() {
	startLines.writing.Lock()
	defer startLines.writing.Unlock()
	startLines.Lock()
	lines := startLines.pending
	startLines.pending = nil
	startLines.Unlock()
	if len(lines) > 0 {
		_, _ = os.Stdout.Write(lines)
	}
}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	obj := r.newObject()
	if r.metadata {
		partial := &metav1.PartialObjectMetadata{}
		partial.SetGroupVersionKind(obj.GetObjectKind().GroupVersionKind())
		if r.kind != "record" {
			partial.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		}
		if err := r.client.Get(ctx, req.NamespacedName, partial); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		started(req.NamespacedName, partial.ResourceVersion)
		// The cache has no data: read the object.
		if err := r.reader.Get(ctx, req.NamespacedName, obj); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	} else {
		if err := r.client.Get(ctx, req.NamespacedName, obj); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		started(req.NamespacedName, obj.GetResourceVersion())
	}
	hash := contentHash(r.content(obj))
	if obj.GetAnnotations()[annotation] != hash {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annotation, hash)
		err := r.client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(patch)))
		if err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	return reconcile.Result{}, r.ensureChildren(ctx, obj, hash)
}

// ownerIndex indexes ConfigMaps by the name of the Record that controls them.
const ownerIndex = ".metadata.controller"

// controllerName is the name of the Record that controls object, if one does.
func controllerName(object client.Object) []string {
	if owner := metav1.GetControllerOf(object); owner != nil && owner.Kind == "Record" {
		return []string{owner.Name}
	}
	return nil
}

// ensureChildren makes each of the owner's children hold its hash, reading them from the cache
// and applying (server-side) those that differ.
func (r *reconciler) ensureChildren(ctx context.Context, owner client.Object, hash string) error {
	listed := map[string]*corev1.ConfigMap{}
	if r.byIndex {
		var children corev1.ConfigMapList
		if err := r.client.List(ctx, &children, client.InNamespace(owner.GetNamespace()), client.MatchingFields{ownerIndex: owner.GetName()}); err != nil {
			return err
		}
		for i := range children.Items {
			listed[children.Items[i].Name] = &children.Items[i]
		}
	}
	for i := 0; i < r.children; i++ {
		name := fmt.Sprintf("%s-c%d", owner.GetName(), i)
		child := &corev1.ConfigMap{}
		var err error
		if found, ok := listed[name]; ok {
			child = found
		} else if r.byIndex {
			err = apierrors.NewNotFound(corev1.Resource("configmaps"), name)
		} else {
			err = r.client.Get(ctx, types.NamespacedName{Namespace: owner.GetNamespace(), Name: name}, child)
		}
		if err == nil && child.Data[childHashKey] == hash {
			continue
		}
		if client.IgnoreNotFound(err) != nil {
			return err
		}
		childLabels := fmt.Sprintf(`{%q:%q}`, childLabel, owner.GetName())
		if set, ok := owner.GetLabels()[setLabel]; ok {
			childLabels = fmt.Sprintf(`{%q:%q,%q:%q}`, childLabel, owner.GetName(), setLabel, set)
		}
		desired := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":%q,"labels":%s,"ownerReferences":[{"apiVersion":"bench.kube-dispatch.dev/v1","kind":"Record","name":%q,"uid":%q,"controller":true}]},"data":{%q:%q}}`,
			name, owner.GetNamespace(), childLabels, owner.GetName(), owner.GetUID(), childHashKey, hash)
		target := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: owner.GetNamespace()}}
		if err := r.client.Patch(ctx, target, client.RawPatch(types.ApplyPatchType, []byte(desired)),
			client.ForceOwnership, client.FieldOwner("bench-controller")); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	kind := flag.String("kind", "config-map", "which resource to reconcile: config-map or record")
	namespace := flag.String("namespace", "", "namespace of the objects; empty for every namespace")
	selector := flag.String("selector", "", "only objects matching this label selector; empty for all")
	metadata := flag.Bool("metadata", false, "metadata-only cache; reconciles GET the object")
	concurrency := flag.Int("concurrency", 16, "most reconciles running at once (MaxConcurrentReconciles)")
	children := flag.Int("children", 0, "ConfigMaps each Record owns and keeps (--kind record, whole-object cache); 0 for none")
	childrenFrom := flag.String("children-from", "get", "how a reconcile finds its children: get (each read by name) or index (one List through a field index on their controller)")
	cacheSyncTimeout := flag.Duration("cache-sync-timeout", time.Hour, "how long the cache may take to list before the controller gives up (CacheSyncTimeout)")
	leaderElect := flag.Bool("leader-elect", false, "run as one of several replicas, the one holding the Lease \"bench-controller-runtime\" in --namespace leading (needs --namespace)")
	warmup := flag.Bool("warmup", false, "with --leader-elect: the standby starts its sources (a full cache) before it leads (EnableWarmup)")
	flag.Parse()
	usage := "usage: bench-controller-runtime [--namespace NS] [--selector LABELS] [--kind config-map|record] [--metadata] [--concurrency N] [--children C [--children-from get|index]] [--cache-sync-timeout D] [--leader-elect [--warmup]]"
	if flag.NArg() > 0 || (*leaderElect && *namespace == "") || (*warmup && !*leaderElect) || (*kind != "config-map" && *kind != "record") || (*children > 0 && (*kind != "record" || *metadata)) ||
		(*childrenFrom != "get" && *childrenFrom != "index") || (*childrenFrom == "index" && *children == 0) {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	// The cache lists and watches what the controller reconciles: one namespace or all, and
	// only the selected objects.
	cacheOptions := cache.Options{}
	if *namespace != "" {
		cacheOptions.DefaultNamespaces = map[string]cache.Config{*namespace: {}}
	}
	if *selector != "" {
		parsed, err := labels.Parse(*selector)
		if err != nil {
			fmt.Fprintf(os.Stderr, "--selector %q: %v\n%s\n", *selector, err, usage)
			os.Exit(2)
		}
		cacheOptions.DefaultLabelSelector = parsed
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	config := ctrl.GetConfigOrDie()
	// kube-rs and the SDK have no client-side rate limit; controller-runtime's default (20 QPS,
	// burst 30) would make the figures about the limiter, not the controller.
	config.QPS = -1
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Cache: cacheOptions,
		// Records are read as unstructured objects (no Go type here); a controller with a typed
		// CRD reads them from the cache, so this one does too (controller-runtime reads
		// unstructured objects from the API server unless told).
		Client:                 client.Options{Cache: &client.CacheOptions{Unstructured: true}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         *leaderElect,
		// The Lease is named for the benchmark's controller; a clean stop gives it up at once
		// (see the package comment).
		LeaderElectionID:              "bench-controller-runtime",
		LeaderElectionNamespace:       *namespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create the manager:", err)
		os.Exit(1)
	}
	r := &reconciler{client: mgr.GetClient(), reader: mgr.GetAPIReader(), kind: *kind, metadata: *metadata, children: *children, byIndex: *childrenFrom == "index"}
	if r.byIndex {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.ConfigMap{}, ownerIndex, controllerName); err != nil {
			fmt.Fprintln(os.Stderr, "cannot index the children:", err)
			os.Exit(1)
		}
	}
	var opts []builder.ForOption
	if *metadata {
		opts = append(opts, builder.OnlyMetadata)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("bench").
		For(r.newObject(), opts...)
	if *children > 0 {
		b = b.Owns(&corev1.ConfigMap{})
	}
	err = b.
		WithOptions(controller.Options{
			MaxConcurrentReconciles: *concurrency,
			// kube-rs waits for its list however long it takes; controller-runtime gives up
			// after 2 minutes by default, which 10 controllers listing 100k custom resources
			// each on a 2-core machine exceeded. Wait as long as kube-rs would.
			CacheSyncTimeout: *cacheSyncTimeout,
			EnableWarmup:     warmup,
		}).
		Complete(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create the controller:", err)
		os.Exit(1)
	}
	if err := mgr.Add(readyLine{}); err != nil {
		fmt.Fprintln(os.Stderr, "cannot add the ready line:", err)
		os.Exit(1)
	}
	err = mgr.Start(ctrl.SetupSignalHandler())
	flushStarts()
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager stopped:", err)
		os.Exit(1)
	}
}

// readyLine prints "ready" on stdout when the manager starts what needs no leader, standby or
// not: the harness starts the next step of a rollout then.
type readyLine struct{}

func (readyLine) Start(ctx context.Context) error {
	fmt.Fprintln(os.Stdout, "ready")
	<-ctx.Done()
	return nil
}

func (readyLine) NeedLeaderElection() bool { return false }
