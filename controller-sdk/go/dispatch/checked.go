package dispatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// Checked is what a reconcile knows of its children's versions that hold what it wants, for
// one desired state, kept in the key's memo for the next reconcile: that reconcile then reads
// only a child whose version is not among them (changed by someone else since, or never
// checked), where a cached controller reads none and a stateless one without this reads them
// all.
//
// desired names what the children are made from (the owner's metadata.generation, a hash of
// the fields they copy, the versions of the objects they name): when it changes, nothing
// recorded counts. Record a child after writing it (with the version the write returned) or
// after reading it and finding it as wanted; Leave the record at the end of the reconcile.
// Each child takes 8 bytes of the memo (a fingerprint of its group, kind, name and version), so
// up to 62 fit; past that Leave fails and the next reconcile reads them all. The memo's format
// is the Rust SDK's (children::Checked), byte for byte.
//
//	checked := dispatch.CheckedChildren(ctx, strconv.FormatInt(owner.Generation, 10))
//	if children, complete := dispatch.Children(ctx); complete {
//		for _, child := range children {
//			if checked.Holds(child) {
//				continue // as this controller left it: no read
//			}
//			// Get it, write it if it differs, then: checked.Record(r.Scheme(), written)
//		}
//	}
//	if err := checked.Leave(ctx); err != nil { ... }
type Checked struct {
	desired  [8]byte
	children [][8]byte
}

// checkedFormat is the memo's first byte.
const checkedFormat = 1

// CheckedChildren is what the last reconcile of this object recorded for desired, or nothing if
// it recorded for another desired state (or left no memo).
func CheckedChildren(ctx context.Context, desired string) *Checked {
	c := &Checked{desired: fingerprint([]byte(desired))}
	memo := Memo(ctx)
	if len(memo) < 9 || memo[0] != checkedFormat || !bytes.Equal(memo[1:9], c.desired[:]) || (len(memo)-9)%8 != 0 {
		return c
	}
	for rest := memo[9:]; len(rest) > 0; rest = rest[8:] {
		c.children = append(c.children, [8]byte(rest[:8]))
	}
	return c
}

// Holds says whether child, as the delivery shows it, is a version recorded for this desired
// state.
func (c *Checked) Holds(child Child) bool {
	print := childPrint(child.Group, child.Kind, child.Name, child.ResourceVersion)
	for _, recorded := range c.children {
		if recorded == print {
			return true
		}
	}
	return false
}

// Record records object (as a write returned it, or as read and found as wanted) as holding
// this desired state at its resourceVersion; scheme names its kind (the manager's).
func (c *Checked) Record(scheme *runtime.Scheme, object client.Object) error {
	gvk, err := apiutil.GVKForObject(object, scheme)
	if err != nil {
		return err
	}
	print := childPrint(gvk.Group, gvk.Kind, object.GetName(), object.GetResourceVersion())
	for _, recorded := range c.children {
		if recorded == print {
			return nil
		}
	}
	c.children = append(c.children, print)
	return nil
}

// Leave leaves the record in the memo for the next reconcile of this object.
func (c *Checked) Leave(ctx context.Context) error {
	memo := make([]byte, 0, 9+8*len(c.children))
	memo = append(memo, checkedFormat)
	memo = append(memo, c.desired[:]...)
	for _, print := range c.children {
		memo = append(memo, print[:]...)
	}
	if err := LeaveMemo(ctx, memo); err != nil {
		return fmt.Errorf("cannot record %d checked children: %w", len(c.children), err)
	}
	return nil
}

// fingerprint is the first 8 bytes of the SHA-256 of parts, each ended by a zero byte.
func fingerprint(parts ...[]byte) [8]byte {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
		h.Write([]byte{0})
	}
	return [8]byte(h.Sum(nil))
}

func childPrint(group, kind, name, version string) [8]byte {
	return fingerprint([]byte(group), []byte(kind), []byte(name), []byte(version))
}
