package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// NewCache is the manager's cache for controllers on the tier: it keeps no object and starts
// no informer. Its IndexField declares a field index, as controller-runtime's does, and a
// List through the manager's client (NewClient) or through this cache with
// client.MatchingFields on that field is served by one LIST of the namespace from the API
// server's watch cache, filtered by the index function, instead of by an informer of the
// whole kind:
//
//	mgr, err := ctrl.NewManager(cfg, ctrl.Options{NewClient: dispatch.NewClient, NewCache: dispatch.NewCache})
//	err = mgr.GetFieldIndexer().IndexField(ctx, &batchv1.Job{}, ".metadata.controller", ownerName)
//	// in a reconcile:
//	err = r.List(ctx, &jobs, client.InNamespace(req.Namespace), client.MatchingFields{".metadata.controller": req.Name})
//
// An owner index (its function gives an object's controller's name) listed for the reconciled
// object's own name is served by reading each child its request lists by name from the watch
// cache instead. The LIST is at least as new as the delivered change, the children the
// delivery lists and this process's own last write (resourceVersionMatch=NotOlderThan), so a
// reconcile sees the children it created. A List by index must name a namespace for a namespaced kind: across
// all of them nothing would bound what it reads, and it is refused. GetInformer and
// GetInformerForKind are refused: the dispatchers watch, and the controller subscribes
// through the builder (For, Owns, References).
//
// The options' namespace and selectors are served as the controllers' own (see cacheScope);
// more than one namespace is refused here.
func NewCache(config *rest.Config, options cache.Options) (cache.Cache, error) {
	reader, err := newClient(config, client.Options{HTTPClient: options.HTTPClient, Scheme: options.Scheme, Mapper: options.Mapper}, 0)
	if err != nil {
		return nil, err
	}
	scope, err := newCacheScope(options, reader.Scheme())
	if err != nil {
		return nil, err
	}
	c := &indexCache{scope: scope, indexes: &indexes{scheme: reader.Scheme(), byKind: map[schema.GroupVersionKind]map[string]client.IndexerFunc{}}}
	reader.indexes = c.indexes
	c.reader = reader
	return c, nil
}

// indexCache is NewCache's cache: the indexes declared, and a reader that serves them.
type indexCache struct {
	// scope is what the manager's cache options narrow; unapplied is logged once.
	scope     *cacheScope
	unapplied sync.Once
	indexes   *indexes
	reader    *deliveredClient
}

var _ cache.Cache = (*indexCache)(nil)

// errNoInformers refuses what needs an informer.
var errNoInformers = errors.New("kube-dispatch: dispatch.NewCache keeps no informers: subscribe to a kind through the builder (For, Owns, References), read through the manager's client")

func (c *indexCache) Get(ctx context.Context, key client.ObjectKey, object client.Object, options ...client.GetOption) error {
	return c.reader.Get(ctx, key, object, options...)
}

func (c *indexCache) List(ctx context.Context, list client.ObjectList, options ...client.ListOption) error {
	return c.reader.List(ctx, list, options...)
}

// GetInformer is refused: an informer would cache the whole kind.
func (c *indexCache) GetInformer(context.Context, client.Object, ...cache.InformerGetOption) (cache.Informer, error) {
	return nil, errNoInformers
}

// GetInformerForKind is refused: an informer would cache the whole kind.
func (c *indexCache) GetInformerForKind(context.Context, schema.GroupVersionKind, ...cache.InformerGetOption) (cache.Informer, error) {
	return nil, errNoInformers
}

// RemoveInformer has nothing to remove.
func (c *indexCache) RemoveInformer(context.Context, client.Object) error { return nil }

// Start waits for ctx: there is nothing to run. It logs the kinds whose cache options no
// controller's session serves.
func (c *indexCache) Start(ctx context.Context) error {
	if kinds := c.scope.unserved(); len(kinds) > 0 {
		logf.Log.WithName("kube-dispatch").Info("cache options ByObject of kinds no controller on the tier reconciles or owns are not applied: reads of them go to the API server, which returns what their selectors would have hidden", "kinds", kinds)
	}
	<-ctx.Done()
	return nil
}

// WaitForCacheSync is true at once: there is nothing to sync.
func (c *indexCache) WaitForCacheSync(context.Context) bool { return true }

// IndexField declares the index field on object's kind, computed by extract.
func (c *indexCache) IndexField(_ context.Context, object client.Object, field string, extract client.IndexerFunc) error {
	return c.indexes.add(object, field, extract)
}

// indexes are the field indexes declared through NewCache, by kind and field.
//
// Bound: one function per IndexField call the controller makes (at start-up).
type indexes struct {
	scheme *runtime.Scheme
	mu     sync.RWMutex
	byKind map[schema.GroupVersionKind]map[string]client.IndexerFunc
}

func (x *indexes) add(object client.Object, field string, extract client.IndexerFunc) error {
	gvk, err := apiutil.GVKForObject(object, x.scheme)
	if err != nil {
		return fmt.Errorf("kube-dispatch: IndexField %q: %w", field, err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byKind[gvk] == nil {
		x.byKind[gvk] = map[string]client.IndexerFunc{}
	}
	if _, ok := x.byKind[gvk][field]; ok {
		return fmt.Errorf("kube-dispatch: IndexField %q on %s declared twice", field, gvk.Kind)
	}
	x.byKind[gvk][field] = extract
	return nil
}

// of is the index field on kind, if declared.
func (x *indexes) of(kind schema.GroupVersionKind, field string) client.IndexerFunc {
	if x == nil {
		return nil
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.byKind[kind][field]
}

// wanted is one requirement of a List by index: the objects whose index field holds value.
type wanted struct {
	field   string
	value   string
	extract client.IndexerFunc
}

// byIndex splits a List's field selector into the requirements on declared indexes and the
// rest (for the API server). It is nil when none names an index.
func (x *indexes) byIndex(kind schema.GroupVersionKind, selector fields.Selector) (want []wanted, rest fields.Selector, err error) {
	if selector == nil || selector.Empty() {
		return nil, selector, nil
	}
	var others []fields.Selector
	for _, r := range selector.Requirements() {
		extract := x.of(kind, r.Field)
		if extract == nil {
			if r.Operator == selection.NotEquals {
				others = append(others, fields.OneTermNotEqualSelector(r.Field, r.Value))
			} else {
				others = append(others, fields.OneTermEqualSelector(r.Field, r.Value))
			}
			continue
		}
		if r.Operator != selection.Equals && r.Operator != selection.DoubleEquals {
			return nil, nil, fmt.Errorf("kube-dispatch: index %q on %s takes only an exact match (client.MatchingFields)", r.Field, kind.Kind)
		}
		want = append(want, wanted{field: r.Field, value: r.Value, extract: extract})
	}
	if len(want) == 0 {
		return nil, selector, nil
	}
	return want, fields.AndSelectors(others...), nil
}

// matches says whether object holds every wanted value.
func matches(object client.Object, want []wanted) bool {
	for _, w := range want {
		found := false
		for _, v := range w.extract(object) {
			if v == w.value {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// List serves a List by a declared index (see NewCache), and passes any other to the API
// server, saying what to do when the API server cannot select on a field.
func (c *deliveredClient) List(ctx context.Context, list client.ObjectList, options ...client.ListOption) error {
	opts := (&client.ListOptions{}).ApplyOptions(options)
	gvk, err := apiutil.GVKForObject(list, c.Scheme())
	if err != nil {
		return c.Client.List(ctx, list, options...)
	}
	kind := gvk.GroupVersion().WithKind(strings.TrimSuffix(gvk.Kind, "List"))
	want, rest, err := c.indexes.byIndex(kind, opts.FieldSelector)
	if err != nil {
		return err
	}
	if want == nil {
		err := c.Client.List(ctx, list, options...)
		if opts.FieldSelector != nil && !opts.FieldSelector.Empty() && apierrors.IsBadRequest(err) {
			return fmt.Errorf("kube-dispatch: the API server cannot select %s by %s, and no index of that name was declared: declare it with mgr.GetFieldIndexer().IndexField on a manager made with ctrl.Options{NewCache: dispatch.NewCache}: %w", kind.Kind, opts.FieldSelector, err)
		}
		return err
	}
	if opts.Continue != "" || opts.Raw != nil {
		return fmt.Errorf("kube-dispatch: a List of %s by index %q is whole: it takes no client.Continue and no raw ListOptions", kind.Kind, want[0].field)
	}
	namespaced, err := apiutil.IsGVKNamespaced(kind, c.RESTMapper())
	if err != nil {
		return fmt.Errorf("kube-dispatch: a List of %s by index %q: %w", kind.Kind, want[0].field, err)
	}
	if namespaced && opts.Namespace == "" {
		return fmt.Errorf("kube-dispatch: a List of %s by index %q needs client.InNamespace: across every namespace it would read every %s of the cluster", kind.Kind, want[0].field, kind.Kind)
	}
	if done, err := c.childrenByName(ctx, list, kind, opts, rest, want); done {
		return err
	}
	return c.listByIndex(ctx, list, kind, opts, rest, want)
}

// listByIndex lists opts's namespace (and label selector) from the API server's watch cache,
// at least as new as what the reconcile has seen and this process has written, and keeps the
// objects that hold every wanted value.
func (c *deliveredClient) listByIndex(ctx context.Context, list client.ObjectList, kind schema.GroupVersionKind, opts *client.ListOptions, rest fields.Selector, want []wanted) error {
	read := &client.ListOptions{
		Namespace:     opts.Namespace,
		LabelSelector: opts.LabelSelector,
		FieldSelector: rest,
		Raw:           &metav1.ListOptions{ResourceVersion: c.seen(ctx), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
	}
	scope := deletionScope{kind: kind.GroupKind(), namespace: opts.Namespace}
	deleted, mark := c.fresh.deleted.since(scope)
	if deleted {
		read.Raw = nil
	}
	err := c.Client.List(ctx, list, read)
	if err != nil && read.Raw != nil && watchCacheCannotServe(err) {
		read.Raw = nil
		err = c.Client.List(ctx, list, read)
	}
	if err != nil {
		return err
	}
	if read.Raw == nil {
		// A consistent read: later Lists are at least as new, and see the deletions before it.
		if l, err := meta.ListAccessor(list); err == nil {
			if v, ok := comparableVersion(l.GetResourceVersion()); ok {
				raise(&c.fresh.written, v)
			}
		}
		c.fresh.deleted.listed(scope, mark)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	kept := items[:0]
	for _, item := range items {
		if object, ok := item.(client.Object); ok && matches(object, want) {
			kept = append(kept, item)
		}
	}
	if opts.Limit > 0 && int64(len(kept)) > opts.Limit {
		kept = kept[:opts.Limit]
	}
	return meta.SetList(list, kept)
}

// seen is the resourceVersion a read for the reconcile in ctx must be at least as new as: the
// delivered change's, its children's and this process's last write's, whichever is newest ("0",
// any, outside a reconcile with none written).
func (c *deliveredClient) seen(ctx context.Context) string {
	newest := c.fresh.written.Load()
	if d := deliveryFrom(ctx); d != nil {
		if v, ok := comparableVersion(d.Request.GetResourceVersion()); ok {
			newest = max(newest, v)
		}
		for _, child := range d.Request.GetChildren() {
			if v, ok := comparableVersion(child.GetResourceVersion()); ok {
				newest = max(newest, v)
			}
		}
	}
	return fmt.Sprint(newest)
}

// freshness is what a process wrote last: the newest version any write returned, the newest
// each key's reconciles wrote of each kind, and the deletions it made since Lists of their
// kind and namespace last read the API server consistently.
type freshness struct {
	written atomic.Uint64
	own     ownWrites
	deleted deletions
}

// deletionScope is where a deletion may show: a kind in a namespace ("" for every namespace,
// or a cluster-scoped kind).
type deletionScope struct {
	kind      schema.GroupKind
	namespace string
}

// deletions are the deletions this process made, by kind and namespace. A deletion answers no
// version, so the next List by index of its kind and namespace reads the API server
// consistently (no resourceVersion), and the children a request lists are not taken as they
// are: either could show what was deleted.
//
// Bound: deletionScopesKept scopes; past it the oldest is forgotten, and a scope not known is
// taken as having a deletion as late as the latest forgotten (one consistent List more).
type deletions struct {
	mu sync.Mutex
	// seq numbers the deletions and consistent Lists in the order they happen.
	seq   uint64
	by    map[deletionScope]*deletionMarks
	order []deletionScope
	// forgotten is the latest deletion among the scopes forgotten.
	forgotten uint64
}

// deletionMarks are a scope's latest deletion and the start of its latest consistent List.
type deletionMarks struct{ deleted, listed uint64 }

const deletionScopesKept = 4096

// marks are scope's marks, made (as a scope not known) if missing.
func (d *deletions) marks(scope deletionScope) *deletionMarks {
	if d.by == nil {
		d.by = map[deletionScope]*deletionMarks{}
	}
	if m, ok := d.by[scope]; ok {
		return m
	}
	if len(d.order) >= deletionScopesKept {
		oldest := d.order[0]
		d.forgotten = max(d.forgotten, d.by[oldest].deleted)
		delete(d.by, oldest)
		d.order = d.order[1:]
	}
	m := &deletionMarks{deleted: d.forgotten}
	d.by[scope] = m
	d.order = append(d.order, scope)
	return m
}

// noted records a deletion of a kind in namespace ("" for every namespace).
func (d *deletions) noted(scope deletionScope) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	d.marks(scope).deleted = d.seq
}

// since is whether a List of scope may show a deletion (of its namespace, or of every
// namespace) made since its last consistent List, and the mark to pass to listed once a
// consistent List has succeeded.
func (d *deletions) since(scope deletionScope) (bool, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	listed := d.marks(scope).listed
	deleted := d.marks(scope).deleted
	if scope.namespace != "" {
		deleted = max(deleted, d.marks(deletionScope{kind: scope.kind}).deleted)
	}
	d.seq++
	return deleted > listed, d.seq
}

// listed records that a consistent List of scope began at mark.
func (d *deletions) listed(scope deletionScope, mark uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.marks(scope)
	m.listed = max(m.listed, mark)
}

// afterDelete counts a deletion of object (in namespace, or every namespace for "") that
// succeeded (err nil, or not found: gone either way), or a write that let it go.
func (c *deliveredClient) afterDelete(object client.Object, namespace string, err error) error {
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	gvk, kindErr := apiutil.GVKForObject(object, c.Scheme())
	if kindErr != nil {
		// Of a kind the scheme does not know: every List by index of it reads consistently.
		return err
	}
	c.fresh.deleted.noted(deletionScope{kind: gvk.GroupKind(), namespace: namespace})
	return err
}

// raise makes value at least v.
func raise(value *atomic.Uint64, v uint64) {
	for {
		current := value.Load()
		if v <= current || value.CompareAndSwap(current, v) {
			return
		}
	}
}

// wrote records the version a write returned, for later lists to be at least as new, and,
// within a reconcile, for an object with a controller (a child), as the newest write of its
// kind for the key (ownWrites), as the Rust SDK does. A write that
// took the last finalizer off an object being deleted deleted it, at a version newer than the
// one it answered: it counts as a deletion.
func (c *deliveredClient) wrote(ctx context.Context, object client.Object, err error) error {
	if err != nil {
		return err
	}
	if object.GetDeletionTimestamp() != nil && len(object.GetFinalizers()) == 0 {
		_ = c.afterDelete(object, object.GetNamespace(), nil)
	}
	if gvk, err := apiutil.GVKForObject(object, c.Scheme()); err == nil {
		c.noteWrite(ctx, gvk.GroupKind(), object.GetResourceVersion(), metav1.GetControllerOf(object) != nil)
	}
	return nil
}

// applied is wrote for a server-side apply, whose answer the client decoded into its apply
// configuration: its kind and version are read from the configuration's JSON.
func (c *deliveredClient) applied(ctx context.Context, object runtime.ApplyConfiguration, err error) error {
	if err != nil {
		return err
	}
	var answer struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			ResourceVersion string                  `json:"resourceVersion"`
			OwnerReferences []metav1.OwnerReference `json:"ownerReferences"`
		} `json:"metadata"`
	}
	if body, err := json.Marshal(object); err == nil && json.Unmarshal(body, &answer) == nil {
		if gv, err := schema.ParseGroupVersion(answer.APIVersion); err == nil {
			child := slices.ContainsFunc(answer.Metadata.OwnerReferences, func(r metav1.OwnerReference) bool {
				return r.Controller != nil && *r.Controller
			})
			c.noteWrite(ctx, gv.WithKind(answer.Kind).GroupKind(), answer.Metadata.ResourceVersion, child)
		}
	}
	return nil
}

// noteWrite moves the process's floor to version, and, for a child, the key's own writes of
// kind: a write of any other object (the owner's status, an object the controller only
// references) says nothing of the key's children.
func (c *deliveredClient) noteWrite(ctx context.Context, kind schema.GroupKind, version string, child bool) {
	v, ok := comparableVersion(version)
	if !ok {
		return
	}
	raise(&c.fresh.written, v)
	if d := deliveryFrom(ctx); d != nil && child {
		c.fresh.own.note(ownKey(d.Request.GetKey(), kind), v)
	}
}
