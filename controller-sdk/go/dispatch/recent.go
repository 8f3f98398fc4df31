package dispatch

import (
	"sync"

	"k8s.io/utils/lru"
)

// DefaultRecentObjectsBytes is how much NewClient keeps of the objects reconciles were given
// last (NewClientKeeping): 1 MiB of their JSON, hundreds of objects of a few KiB, far more than
// the reconciles running at once whose writes echo back.
const DefaultRecentObjectsBytes = 1 << 20

// recentObjectsMax bounds their count whatever their size.
const recentObjectsMax = 4096

// recentObjects are the objects the last reconciles were given, as JSON, by controller, Go type
// and request key (one manager's controllers share the client, and a Get into a
// PartialObjectMetadata or a typed object keeps less than another type needs): a delivery
// that names an object at the very version (and uid) a reconcile of the same controller was
// given, into the same type, is served it again instead of a read. The usual case is the OWNED
// delivery that a reconcile's own writes of children cause, when the dispatcher did not keep
// the object's body for it (it keeps it within half its body budget). Bounded by
// their JSON's bytes and by recentObjectsMax, least recently used out first.
type recentObjects struct {
	mu     sync.Mutex
	cache  *lru.Cache
	bytes  int
	budget int
}

type keptObject struct {
	resourceVersion, uid string
	json                 []byte
}

// recentKey is where an object is kept: the controller, the Go type it was read into, and its
// request key.
type recentKey struct {
	controller, goType, key string
}

// newRecentObjects keeps up to budget bytes; nil (keeping nothing) when budget is 0 or less.
func newRecentObjects(budget int) *recentObjects {
	if budget <= 0 {
		return nil
	}
	r := &recentObjects{budget: budget}
	r.cache = lru.NewWithEvictionFunc(recentObjectsMax, func(_ lru.Key, value any) {
		r.bytes -= len(value.(keptObject).json)
	})
	return r
}

// get is the JSON of key's object if a reconcile was given it at resourceVersion, with the
// uid uid when that is known.
func (r *recentObjects) get(key recentKey, resourceVersion, uid string) ([]byte, bool) {
	if r == nil || resourceVersion == "" {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	value, ok := r.cache.Get(key)
	if !ok {
		return nil, false
	}
	kept := value.(keptObject)
	if kept.resourceVersion != resourceVersion || (uid != "" && kept.uid != uid) {
		return nil, false
	}
	return kept.json, true
}

// keep records json as key's object at resourceVersion, with its uid (nothing without a
// version, or when one object alone passes the budget).
func (r *recentObjects) keep(key recentKey, resourceVersion, uid string, json []byte) {
	if r == nil || resourceVersion == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cache.Remove(key)
	if len(json) > r.budget {
		return
	}
	r.cache.Add(key, keptObject{resourceVersion: resourceVersion, uid: uid, json: json})
	r.bytes += len(json)
	for r.bytes > r.budget {
		r.cache.RemoveOldest()
	}
}

// forget drops key (its object was deleted).
func (r *recentObjects) forget(key recentKey) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cache.Remove(key)
}
