package dispatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// Checked is what a reconcile knows of its children's versions that hold what it wants, for
// one desired state, kept in the key's memo for the next reconcile: that reconcile then reads
// only a child whose version is newer than the one recorded (changed by someone else since) or
// that was never recorded, where a cached controller reads none and a stateless one without
// this reads them all.
//
// desired names what the children are made from (the owner's metadata.generation, a hash of
// the fields they copy, the versions of the objects they name): when it changes, nothing
// recorded counts. Record a child after writing it (with the version the write returned) or
// after reading it and finding it as wanted; Leave the record at the end of the reconcile.
//
// A child the delivery shows at an older version than the one recorded holds too: the
// dispatcher has not seen the write yet (a reconcile's own writes come back one by one, and the
// owner is delivered again at the first), and whatever changes the child after that write comes
// with a newer version. Versions are compared as integers, as Kubernetes 1.35 and later
// guarantee for the objects of one resource (KEP-5504); a child whose version is not such an
// integer is not recorded, and is read by the next reconcile.
//
// Each child takes 6 bytes of the memo (a fingerprint of its group, kind, namespace and name)
// and its version as a LEB128 varint (5 bytes below 34 billion): about 45 fit; past the memo's
// bound Leave fails and the next reconcile reads them all. The memo's format is the Rust SDK's
// (children::Checked), byte for byte. A memo an older SDK left (format 2, whose fingerprint
// lacked the namespace) is not read: its children are read once more.
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
	children []checkedChild
}

// checkedChild is a child's fingerprint and the newest version recorded for it.
type checkedChild struct {
	print   [namePrint]byte
	version uint64
}

const (
	// checkedFormat is the memo's first byte. Format 2 fingerprinted a child without its
	// namespace, so same-named children of a cluster-scoped owner in two namespaces shared one
	// record.
	checkedFormat = 3
	// namePrint is the bytes of a child's fingerprint in the memo.
	namePrint = 6
)

// CheckedChildren is what the last reconcile of this object recorded for desired, or nothing if
// it recorded for another desired state (or left no memo, or one in another format).
func CheckedChildren(ctx context.Context, desired string) *Checked {
	c := &Checked{desired: fingerprint([]byte(desired))}
	memo := Memo(ctx)
	if len(memo) < 9 || memo[0] != checkedFormat || !bytes.Equal(memo[1:9], c.desired[:]) {
		return c
	}
	var children []checkedChild
	for rest := memo[9:]; len(rest) > 0; {
		if len(rest) < namePrint {
			return c
		}
		child := checkedChild{print: [namePrint]byte(rest[:namePrint])}
		version, n := binary.Uvarint(rest[namePrint:])
		if n <= 0 {
			return c
		}
		child.version = version
		children = append(children, child)
		rest = rest[namePrint+n:]
	}
	c.children = children
	return c
}

// Holds says whether child, as the delivery shows it, is at or before a version recorded for
// this desired state.
func (c *Checked) Holds(child Child) bool {
	version, ok := comparableVersion(child.ResourceVersion)
	if !ok {
		return false
	}
	print := childPrint(child.Group, child.Kind, child.Namespace, child.Name)
	for _, recorded := range c.children {
		if recorded.print == print && version <= recorded.version {
			return true
		}
	}
	return false
}

// Record records object (as a write returned it, or as read and found as wanted) as holding
// this desired state at its resourceVersion (ignored if that is not an integer); scheme names
// its kind (the manager's).
func (c *Checked) Record(scheme *runtime.Scheme, object client.Object) error {
	gvk, err := apiutil.GVKForObject(object, scheme)
	if err != nil {
		return err
	}
	version, ok := comparableVersion(object.GetResourceVersion())
	if !ok {
		return nil
	}
	print := childPrint(gvk.Group, gvk.Kind, object.GetNamespace(), object.GetName())
	for i := range c.children {
		if c.children[i].print == print {
			c.children[i].version = max(c.children[i].version, version)
			return nil
		}
	}
	c.children = append(c.children, checkedChild{print: print, version: version})
	return nil
}

// Leave leaves the record in the memo for the next reconcile of this object.
func (c *Checked) Leave(ctx context.Context) error {
	memo := make([]byte, 0, 9+(namePrint+5)*len(c.children))
	memo = append(memo, checkedFormat)
	memo = append(memo, c.desired[:]...)
	for _, child := range c.children {
		memo = append(memo, child.print[:]...)
		memo = binary.AppendUvarint(memo, child.version)
	}
	if err := LeaveMemo(ctx, memo); err != nil {
		return fmt.Errorf("cannot record %d checked children: %w", len(c.children), err)
	}
	return nil
}

// comparableVersion is a resourceVersion as Kubernetes 1.35 and later make it comparable: a
// positive decimal integer without leading zeros.
func comparableVersion(version string) (uint64, bool) {
	if version == "" || version[0] == '0' {
		return 0, false
	}
	for _, b := range []byte(version) {
		if b < '0' || b > '9' {
			return 0, false
		}
	}
	value, err := strconv.ParseUint(version, 10, 64)
	return value, err == nil
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

// childPrint is a child's fingerprint in the memo: the first namePrint bytes of the
// fingerprint of its group, kind, namespace (empty for a cluster-scoped child) and name.
func childPrint(group, kind, namespace, name string) [namePrint]byte {
	print := fingerprint([]byte(group), []byte(kind), []byte(namespace), []byte(name))
	return [namePrint]byte(print[:namePrint])
}
