package dispatch

import (
	"context"
	"errors"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// childrenByName serves a List by an owner index (one whose function gives an object's
// controller's name) of the reconciled object's own children from the children its request
// lists: each child of the kind is taken from the request where it carries the child's body
// (no read), or read by name from the API server's watch cache, at least as new as the
// request shows it, instead of one LIST of the whole namespace. It does so only
// when the request lists the children completely and is at least as new as this process's
// own last write for the key (a child created by an earlier reconcile here and not yet seen
// by the dispatcher would be missed); done is false when it did not serve the List.
func (c *deliveredClient) childrenByName(ctx context.Context, list client.ObjectList, kind schema.GroupVersionKind,
	opts *client.ListOptions, rest fields.Selector, want []wanted) (done bool, err error) {
	d := deliveryFrom(ctx)
	if d == nil || len(want) != 1 || (rest != nil && !rest.Empty()) || (opts.LabelSelector != nil && !opts.LabelSelector.Empty()) ||
		d.Request.GetChildrenState() != pb.ChildrenState_CHILDREN_STATE_COMPLETE ||
		want[0].value != d.Name.Name || opts.Namespace != d.Name.Namespace {
		return false, nil
	}
	newItem := c.itemOf(list, kind)
	if newItem == nil || !ownerIndex(newItem(), d, want[0].extract) {
		return false, nil
	}
	var named []*pb.OwnedObject
	newest := uint64(0)
	for _, child := range d.Request.GetChildren() {
		o := child.GetObject()
		if o.GetGroup() != kind.Group || o.GetKind() != kind.Kind || o.GetNamespace() != opts.Namespace {
			continue
		}
		named = append(named, child)
		if v, ok := comparableVersion(child.GetResourceVersion()); ok {
			newest = max(newest, v)
		}
	}
	// None listed: the kind may not be an Owns kind at all. Own writes of the kind newer than
	// any child listed: the dispatcher may not have seen them yet. Many: one LIST is cheaper.
	// A deletion here since the last consistent List: the request may list what it deleted.
	deleted, _ := c.fresh.deleted.since(deletionScope{kind: kind.GroupKind(), namespace: opts.Namespace})
	if len(named) == 0 || len(named) > maxChildReads || deleted || c.fresh.own.newerThan(ownKey(d.Request.GetKey(), kind.GroupKind()), newest) {
		return false, nil
	}
	// Those the request carries are taken from it; the others read at once, at most
	// childReadsAtOnce in flight, kept in their order; the index function runs here, after,
	// as it would in the reconcile's own goroutine.
	read := make([]client.Object, len(named))
	errs := make([]error, len(named))
	slots := make(chan struct{}, childReadsAtOnce)
	var wg sync.WaitGroup
	for i, child := range named {
		// A body is in the version the dispatcher watched: taken only when it is the one read into.
		if body := child.GetObjectJson(); len(body) > 0 && child.GetObject().GetVersion() == kind.Version {
			if object := newItem(); decodeInto(body, object) == nil {
				read[i] = object
				continue
			}
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			object := newItem()
			key := client.ObjectKey{Namespace: opts.Namespace, Name: child.GetObject().GetName()}
			err := c.getAt(ctx, key, object, child.GetResourceVersion())
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				errs[i] = err
			default:
				read[i] = object
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return true, err
	}
	items := make([]runtime.Object, 0, len(read))
	for _, object := range read {
		if object != nil && matches(object, want) {
			items = append(items, object)
		}
	}
	if opts.Limit > 0 && int64(len(items)) > opts.Limit {
		items = items[:opts.Limit]
	}
	return true, meta.SetList(list, items)
}

// itemOf makes an empty item of list (of kind), nil when the scheme cannot.
func (c *deliveredClient) itemOf(list client.ObjectList, kind schema.GroupVersionKind) func() client.Object {
	if _, ok := list.(*metav1.PartialObjectMetadataList); ok {
		return func() client.Object {
			p := &metav1.PartialObjectMetadata{}
			p.SetGroupVersionKind(kind)
			return p
		}
	}
	if _, ok := list.(*unstructured.UnstructuredList); ok {
		return func() client.Object {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(kind)
			return u
		}
	}
	if _, err := c.Scheme().New(kind); err != nil {
		return nil
	}
	return func() client.Object {
		object, _ := c.Scheme().New(kind)
		typed, _ := object.(client.Object)
		return typed
	}
}

// ownerIndex says whether extract gives an object's controller's name: it is asked of probe,
// an empty object controlled by the delivered one, and must answer exactly that name (an
// index function that panics on it is not one).
func ownerIndex(probe client.Object, d *engine.Delivery, extract client.IndexerFunc) (owner bool) {
	defer func() {
		if recover() != nil {
			owner = false
		}
	}()
	o := d.Request.GetObject()
	apiVersion := o.GetVersion()
	if o.GetGroup() != "" {
		apiVersion = o.GetGroup() + "/" + o.GetVersion()
	}
	ask := func(kind string, controller *bool) []string {
		p := probe.DeepCopyObject().(client.Object)
		p.SetNamespace(o.GetNamespace())
		p.SetOwnerReferences([]metav1.OwnerReference{{
			APIVersion: apiVersion, Kind: kind, Name: o.GetName(), UID: types.UID(d.Request.GetUid()), Controller: controller,
		}})
		return extract(p)
	}
	yes := true
	// The name of the controller of the reconciled kind, and of nothing else: not of an owner
	// that does not control, not of a controller of another kind.
	values := ask(o.GetKind(), &yes)
	return len(values) == 1 && values[0] == o.GetName() &&
		len(ask(o.GetKind(), nil)) == 0 && len(ask(o.GetKind()+"Other", &yes)) == 0
}

// ownWrites are the newest resourceVersions this process's reconciles wrote, by request key:
// a request older than its key's last write here may not list the children that write made.
// An entry goes once a request shows its write (newerThan).
//
// Bound: ownWritesKept keys; past it the least recently noted is forgotten first, and its
// key's reads are then as its requests show them, as a cache behind its own writes would be.
// (A floor for every key not known, as this once kept, stayed high for good: every key's read
// became a List once a few thousand had written.)
type ownWrites struct {
	mu    sync.Mutex
	by    map[string]uint64
	order []string
}

const ownWritesKept = 4096

func (w *ownWrites) note(key string, version uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.by == nil {
		w.by = map[string]uint64{}
	}
	if _, known := w.by[key]; known {
		// Noted again: the newest write, forgotten last.
		w.order = slices.DeleteFunc(w.order, func(k string) bool { return k == key })
	} else {
		for len(w.order) >= ownWritesKept {
			delete(w.by, w.order[0])
			w.order = w.order[1:]
		}
	}
	w.order = append(w.order, key)
	w.by[key] = max(w.by[key], version)
}

// newerThan says whether key's newest write here is newer than shown, the newest its request
// shows; a write the request shows is forgotten.
func (w *ownWrites) newerThan(key string, shown uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	v, ok := w.by[key]
	if !ok {
		return false
	}
	if v > shown {
		return true
	}
	delete(w.by, key)
	w.order = slices.DeleteFunc(w.order, func(k string) bool { return k == key })
	return false
}

// ownKey is where ownWrites keeps a reconcile's writes of one kind: a request's children of a
// kind are at least as new as its writes of that kind only when their own versions say so.
func ownKey(requestKey string, kind schema.GroupKind) string {
	return requestKey + "\x00" + kind.String()
}

const (
	// maxChildReads is the most children read by name for one List; past it, one LIST.
	maxChildReads = 64
	// childReadsAtOnce is the most of those reads in flight at once.
	childReadsAtOnce = 8
)
