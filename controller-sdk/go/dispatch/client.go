package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// NewClient is a client.NewClientFunc for manager.Options.NewClient: a client that reads from
// the API server, never from an informer cache (the manager's default client starts an
// informer for every kind it reads, which is the memory the tier exists to save), except that
// a reconcile's Get of the object it was delivered is served from the delivery: from the
// request's body when it carries one, else from the API server's watch cache at the version
// delivered (no quorum read of etcd), and as NotFound when the delivery says the object was
// deleted, which is how a controller-runtime Reconciler learns of a deletion.
//
//	mgr, err := ctrl.NewManager(cfg, ctrl.Options{NewClient: dispatch.NewClient})
//
// A delivery without a body that names the object at the very version a reconcile here was
// given last is served that object again, without a read: the usual case is the OWNED delivery
// that a reconcile's own writes of children cause. NewClient keeps DefaultRecentObjectsBytes
// of them; NewClientKeeping says how much.
//
// A reconcile that writes its delivered object (Update, Patch, or its status) and reads it
// again is served what the write answered, without a request (read-your-writes, which an
// informer cache does not give); the next delivery at that version, the change coming back
// from the dispatcher's watch, is served it as well.
//
// Its requests are counted by verb and controller (kube_dispatch_api_requests_total), the
// objects its Gets of delivered objects served by where they came from
// (kube_dispatch_objects_loaded_total: request, recent, written, read), and the writes of
// reconciles refused as stale (kube_dispatch_stale_writes_total).
func NewClient(config *rest.Config, options client.Options) (client.Client, error) {
	return asClient(newClient(config, options, DefaultRecentObjectsBytes))
}

// NewClientKeeping is NewClient keeping up to bytes of the JSON of the objects reconciles were
// given last (0: none, every delivery without a body is read).
//
//	mgr, err := ctrl.NewManager(cfg, ctrl.Options{NewClient: dispatch.NewClientKeeping(4 << 20)})
func NewClientKeeping(bytes int) client.NewClientFunc {
	return func(config *rest.Config, options client.Options) (client.Client, error) {
		return asClient(newClient(config, options, bytes))
	}
}

// asClient is c as a client.Client, nil (not a nil pointer) with err.
func asClient(c *deliveredClient, err error) (client.Client, error) {
	if err != nil {
		return nil, err
	}
	return c, nil
}

func newClient(config *rest.Config, options client.Options, recent int) (*deliveredClient, error) {
	// The manager's cache, when it is NewCache's, holds the indexes its List serves; no read
	// goes through a cache.
	var declared *indexes
	fresh := &freshness{}
	if options.Cache != nil {
		if c, ok := options.Cache.Reader.(*indexCache); ok {
			declared, fresh = c.indexes, c.reader.fresh
		}
	}
	options.Cache = nil
	counting := countRequests(hostPath(config.Host))
	if options.HTTPClient != nil {
		counted := *options.HTTPClient
		counted.Transport = counting(counted.Transport)
		options.HTTPClient = &counted
	} else {
		config = rest.CopyConfig(config)
		config.Wrap(counting)
	}
	c, err := client.New(config, options)
	if err != nil {
		return nil, err
	}
	return &deliveredClient{Client: c, recent: newRecentObjects(recent), indexes: declared, fresh: fresh}, nil
}

// hostPath is the path of the API server's URL (a proxy serves it under one), or "".
func hostPath(host string) string {
	if u, err := url.Parse(host); err == nil && u.Host != "" {
		return u.Path
	}
	return ""
}

// deliveredClient serves the delivered object's Get from its delivery, or from the objects
// reconciles were given last, and counts the stale writes of reconciles.
type deliveredClient struct {
	client.Client
	recent *recentObjects
	// indexes are those declared through NewCache's IndexField (nil without it).
	indexes *indexes
	// fresh is what this process wrote last, which Lists by index must be at least as new as;
	// shared with NewCache's reader.
	fresh *freshness
}

func (c *deliveredClient) Create(ctx context.Context, object client.Object, options ...client.CreateOption) error {
	return c.wrote(ctx, object, c.Client.Create(ctx, object, options...))
}

func (c *deliveredClient) Update(ctx context.Context, object client.Object, options ...client.UpdateOption) error {
	return c.wroteDelivered(ctx, object, c.wrote(ctx, object, countStale(ctx, object, c.Client.Update(ctx, object, options...))))
}

func (c *deliveredClient) Patch(ctx context.Context, object client.Object, patch client.Patch, options ...client.PatchOption) error {
	return c.wroteDelivered(ctx, object, c.wrote(ctx, object, countStale(ctx, object, c.Client.Patch(ctx, object, patch, options...))))
}

// Apply is a server-side apply: the version its answer holds moves what later Lists by index
// must be at least as new as, as any write's does.
func (c *deliveredClient) Apply(ctx context.Context, object runtime.ApplyConfiguration, options ...client.ApplyOption) error {
	return c.applied(ctx, object, c.Client.Apply(ctx, object, options...))
}

// Delete and DeleteAllOf answer no version: the next List by index of the kind and namespace
// reads the API server consistently (see deletions), so it does not show what was deleted as
// still there.
func (c *deliveredClient) Delete(ctx context.Context, object client.Object, options ...client.DeleteOption) error {
	return c.afterDelete(object, object.GetNamespace(), c.Client.Delete(ctx, object, options...))
}

func (c *deliveredClient) DeleteAllOf(ctx context.Context, object client.Object, options ...client.DeleteAllOfOption) error {
	namespace := (&client.DeleteAllOfOptions{}).ApplyOptions(options).Namespace
	return c.afterDelete(object, namespace, c.Client.DeleteAllOf(ctx, object, options...))
}

func (c *deliveredClient) Status() client.SubResourceWriter {
	return subResourceWriter{c.Client.Status(), c}
}

func (c *deliveredClient) SubResource(subResource string) client.SubResourceClient {
	return subResourceClient{c.Client.SubResource(subResource), c}
}

// subResourceWriter counts the stale writes of a subresource (the status) as of the object,
// and keeps what a write of the delivered object's status answered, as the object's writes.
type subResourceWriter struct {
	client.SubResourceWriter
	c *deliveredClient
}

func (w subResourceWriter) Update(ctx context.Context, object client.Object, options ...client.SubResourceUpdateOption) error {
	return w.c.wroteDelivered(ctx, object, w.c.wrote(ctx, object, countStale(ctx, object, w.SubResourceWriter.Update(ctx, object, options...))))
}

func (w subResourceWriter) Patch(ctx context.Context, object client.Object, patch client.Patch, options ...client.SubResourcePatchOption) error {
	return w.c.wroteDelivered(ctx, object, w.c.wrote(ctx, object, countStale(ctx, object, w.SubResourceWriter.Patch(ctx, object, patch, options...))))
}

func (w subResourceWriter) Apply(ctx context.Context, object runtime.ApplyConfiguration, options ...client.SubResourceApplyOption) error {
	return w.c.applied(ctx, object, w.SubResourceWriter.Apply(ctx, object, options...))
}

type subResourceClient struct {
	client.SubResourceClient
	c *deliveredClient
}

func (s subResourceClient) Update(ctx context.Context, object client.Object, options ...client.SubResourceUpdateOption) error {
	return subResourceWriter{s.SubResourceClient, s.c}.Update(ctx, object, options...)
}

func (s subResourceClient) Patch(ctx context.Context, object client.Object, patch client.Patch, options ...client.SubResourcePatchOption) error {
	return subResourceWriter{s.SubResourceClient, s.c}.Patch(ctx, object, patch, options...)
}

func (s subResourceClient) Apply(ctx context.Context, object runtime.ApplyConfiguration, options ...client.SubResourceApplyOption) error {
	return subResourceWriter{s.SubResourceClient, s.c}.Apply(ctx, object, options...)
}

// wroteDelivered keeps what the API server answered a reconcile's successful write of its
// delivered object (err nil), which the client decoded into object: the reconcile's next Get
// of the object into that type is served it (read-your-writes, without a request), and so is
// the next delivery at that version (the change the write made, coming back from the
// dispatcher's watch), through the recent objects. A status or another subresource's answer
// is the whole object too.
func (c *deliveredClient) wroteDelivered(ctx context.Context, object client.Object, err error) error {
	d := deliveryFrom(ctx)
	if err != nil || d == nil || client.ObjectKeyFromObject(object) != d.Name || object.GetResourceVersion() == "" {
		return err
	}
	gvk, gvkErr := apiutil.GVKForObject(object, c.Scheme())
	delivered := d.Request.GetObject()
	if gvkErr != nil || gvk.Group != delivered.GetGroup() || gvk.Kind != delivered.GetKind() {
		return nil
	}
	body, jsonErr := json.Marshal(object)
	if jsonErr != nil {
		return nil
	}
	goType := fmt.Sprintf("%T", object)
	d.Wrote(goType, body)
	c.recent.keep(recentKey{controller: d.Metrics.Controller, goType: goType, key: d.Request.GetKey()}, object.GetResourceVersion(), string(object.GetUID()), body)
	return nil
}

func (c *deliveredClient) Get(ctx context.Context, key client.ObjectKey, object client.Object, options ...client.GetOption) error {
	d := deliveryFrom(ctx)
	if d == nil || len(options) > 0 || key != d.Name {
		return c.Client.Get(ctx, key, object, options...)
	}
	gvk, err := apiutil.GVKForObject(object, c.Scheme())
	delivered := d.Request.GetObject()
	if err != nil || gvk.Group != delivered.GetGroup() || gvk.Version != delivered.GetVersion() || gvk.Kind != delivered.GetKind() {
		return c.Client.Get(ctx, key, object, options...)
	}
	// After the reconcile's own write of the object, a read is what that write answered: newer
	// than the delivery. Otherwise the first read is the delivery's, and a later one (after a
	// write into another type, say) reads the API server.
	goType := fmt.Sprintf("%T", object)
	if body, ok := d.Written(goType); ok {
		d.Serve()
		d.Metrics.Loaded("written")
		return decodeInto(body, object)
	}
	if !d.Serve() {
		return c.Client.Get(ctx, key, object)
	}
	requestKey := recentKey{controller: d.Metrics.Controller, goType: goType, key: d.Request.GetKey()}
	if d.Request.GetDeleted() {
		c.recent.forget(requestKey)
		d.Metrics.Loaded("request")
		plural, _ := meta.UnsafeGuessKindToResource(gvk)
		resource := plural.GroupResource()
		if mapping, err := c.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version); err == nil {
			resource = mapping.Resource.GroupResource()
		}
		return apierrors.NewNotFound(resource, key.Name)
	}
	if body := d.Request.GetObjectJson(); len(body) > 0 {
		d.Metrics.Loaded("request")
		if err := decodeInto(body, object); err != nil {
			return fmt.Errorf("kube-dispatch: cannot decode the delivered %s %s: %w", gvk.Kind, key, err)
		}
		c.recent.keep(requestKey, object.GetResourceVersion(), string(object.GetUID()), body)
		return nil
	}
	if kept, ok := c.recent.get(requestKey, d.Request.GetResourceVersion(), d.Request.GetUid()); ok {
		d.Metrics.Loaded("recent")
		if err := decodeInto(kept, object); err != nil {
			return fmt.Errorf("kube-dispatch: cannot decode the kept %s %s: %w", gvk.Kind, key, err)
		}
		return nil
	}
	d.Metrics.Loaded("read")
	// No body: the API server's watch cache, at least as new as the change delivered.
	err = c.getAt(ctx, key, object, d.Request.GetResourceVersion())
	switch {
	case apierrors.IsNotFound(err):
		c.recent.forget(requestKey)
	case err == nil && c.recent != nil:
		if body, err := json.Marshal(object); err == nil {
			c.recent.keep(requestKey, object.GetResourceVersion(), string(object.GetUID()), body)
		}
	}
	return err
}

// decodeInto decodes body into object, zeroed first: whatever the caller's object held before
// (labels, data) must not survive into what the reconcile reads.
func decodeInto(body []byte, object client.Object) error {
	if u, ok := object.(*unstructured.Unstructured); ok {
		u.Object = nil
		return u.UnmarshalJSON(body)
	}
	value := reflect.ValueOf(object)
	if value.Kind() == reflect.Pointer && !value.IsNil() {
		value.Elem().SetZero()
	}
	return json.Unmarshal(body, object)
}

// getAt reads key into object from the API server's watch cache, at least as new as version;
// a cache that has not caught up (or cannot serve that version) is read consistently instead.
func (c *deliveredClient) getAt(ctx context.Context, key client.ObjectKey, object client.Object, version string) error {
	err := c.Client.Get(ctx, key, object, &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: version}})
	if err != nil && watchCacheCannotServe(err) {
		err = c.Client.Get(ctx, key, object)
	}
	return err
}

// watchCacheCannotServe says a read at a resourceVersion should be made consistently instead:
// the version is too old or not yet in the cache (400, 410, 504), or the cache is not ready
// (500, 503).
func watchCacheCannotServe(err error) bool {
	switch apierrors.ReasonForError(err) {
	case metav1.StatusReasonBadRequest, metav1.StatusReasonGone, metav1.StatusReasonExpired,
		metav1.StatusReasonTimeout, metav1.StatusReasonServiceUnavailable, metav1.StatusReasonInternalError:
		return true
	}
	var status apierrors.APIStatus
	if s, ok := err.(apierrors.APIStatus); ok {
		status = s
		switch status.Status().Code {
		case http.StatusBadRequest, http.StatusGone, http.StatusInternalServerError,
			http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
	}
	return false
}
