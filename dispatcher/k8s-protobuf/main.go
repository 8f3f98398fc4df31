// Command k8s-protobuf writes the table by which a dispatcher turns the built-in Kubernetes
// types' protobuf encoding (`application/vnd.kubernetes.protobuf`) into the JSON the API
// server would have sent for the same object.
//
// The protobuf descriptors alone cannot say what that JSON is: every field is optional there,
// so a zero on the wire may be a Go pointer (which JSON writes) or a plain field with
// `omitempty` (which JSON leaves out), and some fields have a JSON name other than their
// protobuf name. The Go types say all of it, in their `protobuf` and `json` struct tags. This
// program walks every type of client-go's scheme by reflection and writes, for each, its
// fields in the order `encoding/json` writes them: the protobuf field number, the JSON name,
// the shape of the value and whether it is left out when empty. A type whose JSON form it
// cannot describe (a custom JSON marshaller it does not know, a field it cannot map) is left
// out, with every kind that reaches it; a dispatcher reads those kinds in JSON.
//
// Usage (from the repository's root; `make protobuf-table` does it):
//
//	go run ./dispatcher/k8s-protobuf > dispatcher/src/watch/protobuf/table.txt
//
// The format, a line each:
//
//	# comment
//	t <index> <Go type>                  a message type; its fields follow
//	f <number> <json name> <shape> <flags>
//	k <apiVersion> <kind> <type index>   a kind the API server may send
//
// A field's number is 0 when the field is not on the wire (TypeMeta in an object); its JSON
// name is `-` for a struct whose fields JSON writes inline. A shape is read from the left:
// `*` a pointer to what follows, `[` a repeated field of it, `{` a map whose key is the next
// scalar, `w` a named list that protobuf wraps in a message of `items` (Verbs, ExtraValue);
// then one of the scalars `s` string, `b` bool, `i` int32, `l` int64, `y` bytes, the
// special types `T` Time, `M` MicroTime, `D` Duration, `Q` Quantity, `I` IntOrString, `R`
// RawExtension, `F` FieldsV1, or `m<index>` a message type. Flags: `e` omitempty, `z`
// omitzero, `-` none.
package main

import (
	"encoding"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
)

// The types whose JSON is written by a marshaller of their own, and the shape that stands for it.
var special = map[reflect.Type]string{
	reflect.TypeFor[metav1.Time]():          "T",
	reflect.TypeFor[metav1.MicroTime]():     "M",
	reflect.TypeFor[metav1.Duration]():      "D",
	reflect.TypeFor[resource.Quantity]():    "Q",
	reflect.TypeFor[intstr.IntOrString]():   "I",
	reflect.TypeFor[runtime.RawExtension](): "R",
	reflect.TypeFor[metav1.FieldsV1]():      "F",
}

var (
	jsonMarshaler  = reflect.TypeFor[json.Marshaler]()
	textMarshaler  = reflect.TypeFor[encoding.TextMarshaler]()
	protoUnmarshal = reflect.TypeFor[interface{ Unmarshal([]byte) error }]()
	typeMeta       = reflect.TypeFor[metav1.TypeMeta]()
	listMeta       = reflect.TypeFor[metav1.ListMeta]()
)

// marshalsItself says whether encoding/json writes t through a method of t's (or *t's) own.
func marshalsItself(t reflect.Type) bool {
	for _, m := range []reflect.Type{jsonMarshaler, textMarshaler} {
		if t.Implements(m) || reflect.PointerTo(t).Implements(m) {
			return true
		}
	}
	return false
}

// embedsTypeMeta says whether struct t carries a TypeMeta of its own, inline.
func embedsTypeMeta(t reflect.Type) bool {
	for i := range t.NumField() {
		if f := t.Field(i); f.Anonymous && f.Type == typeMeta {
			return true
		}
	}
	return false
}

// hasListMeta says whether struct t is a list: it has a ListMeta.
func hasListMeta(t reflect.Type) bool {
	for i := range t.NumField() {
		if t.Field(i).Type == listMeta {
			return true
		}
	}
	return false
}

type field struct {
	number  int
	name    string
	shape   string
	flags   string
	typeRef []reflect.Type // message types the shape names
}

type message struct {
	index  int
	fields []field
	err    error
}

type walker struct {
	types map[reflect.Type]*message
	order []reflect.Type
}

// message describes struct type t, walking what it reaches; a type it cannot describe carries
// the reason in err.
func (w *walker) message(t reflect.Type) *message {
	if m, ok := w.types[t]; ok {
		return m
	}
	m := &message{index: -1}
	w.types[t] = m
	w.order = append(w.order, t)
	if marshalsItself(t) {
		m.err = fmt.Errorf("%v has a JSON or text marshaller of its own", t)
		return m
	}
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		jsonTag := sf.Tag.Get("json")
		if jsonTag == "-" {
			continue
		}
		parts := strings.Split(jsonTag, ",")
		name, opts := parts[0], parts[1:]
		f := field{flags: ""}
		for _, o := range opts {
			switch o {
			case "omitempty":
				f.flags += "e"
			case "omitzero":
				f.flags += "z"
			case "inline", "":
			default:
				m.err = fmt.Errorf("%v.%s: JSON option %q", t, sf.Name, o)
				return m
			}
		}
		if f.flags == "" {
			f.flags = "-"
		}
		if pb := sf.Tag.Get("protobuf"); pb != "" && pb != "-" {
			n, err := strconv.Atoi(strings.Split(pb, ",")[1])
			if err != nil {
				m.err = fmt.Errorf("%v.%s: protobuf tag %q", t, sf.Name, pb)
				return m
			}
			f.number = n
		}
		if sf.Anonymous && name == "" {
			// encoding/json writes an embedded struct's fields in its parent's object.
			if sf.Type.Kind() != reflect.Struct {
				m.err = fmt.Errorf("%v.%s: embedded %v", t, sf.Name, sf.Type)
				return m
			}
			if _, ok := special[sf.Type]; ok {
				m.err = fmt.Errorf("%v.%s: embedded special type", t, sf.Name)
				return m
			}
			name = "-"
		} else if name == "" {
			name = sf.Name
		}
		f.name = name
		shape, refs, err := w.shape(sf.Type, f.number != 0 && strings.Contains(sf.Tag.Get("protobuf"), ",rep,"))
		if err != nil {
			m.err = fmt.Errorf("%v.%s: %w", t, sf.Name, err)
			return m
		}
		if strings.Contains(f.flags, "z") && shape != "T" && shape != "M" {
			m.err = fmt.Errorf("%v.%s: omitzero on %v", t, sf.Name, sf.Type)
			return m
		}
		// An object inside another with a TypeMeta of its own (a StatefulSet's claim
		// templates): the API server's conversion may fill its apiVersion and kind in, which
		// JSON carries and protobuf does not. A list's items are written without them in both.
		for _, r := range refs {
			if embedsTypeMeta(r) && !(name == "items" && hasListMeta(t)) {
				m.err = fmt.Errorf("%v.%s: an object with a TypeMeta of its own inside another", t, sf.Name)
				return m
			}
		}
		f.shape, f.typeRef = shape, refs
		m.fields = append(m.fields, f)
	}
	return m
}

// shape gives the shape of a value of type t; repeated says the protobuf tag marks the field
// repeated, which a named list wrapped in a message is not.
func (w *walker) shape(t reflect.Type, repeated bool) (string, []reflect.Type, error) {
	if s, ok := special[t]; ok {
		return s, nil, nil
	}
	if t.Kind() != reflect.Pointer && marshalsItself(t) {
		return "", nil, fmt.Errorf("%v has a JSON or text marshaller of its own", t)
	}
	switch t.Kind() {
	case reflect.Pointer:
		s, refs, err := w.shape(t.Elem(), false)
		return "*" + s, refs, err
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "y", nil, nil
		}
		prefix := "["
		if t.Name() != "" && reflect.PointerTo(t).Implements(protoUnmarshal) && !repeated {
			prefix = "w"
		}
		s, refs, err := w.shape(t.Elem(), false)
		if err == nil && strings.ContainsAny(s[:1], "[w{") {
			err = fmt.Errorf("a list of lists or maps (%v)", t)
		}
		return prefix + s, refs, err
	case reflect.Map:
		k, _, err := w.shape(t.Key(), false)
		if err != nil {
			return "", nil, err
		}
		if k != "s" {
			return "", nil, fmt.Errorf("a map keyed by %v", t.Key())
		}
		s, refs, err := w.shape(t.Elem(), false)
		return "{" + k + s, refs, err
	case reflect.Struct:
		return "m", []reflect.Type{t}, nil
	case reflect.String:
		return "s", nil, nil
	case reflect.Bool:
		return "b", nil, nil
	case reflect.Int32:
		return "i", nil, nil
	case reflect.Int64:
		return "l", nil, nil
	}
	return "", nil, fmt.Errorf("a value of %v", t)
}

func main() {
	w := &walker{types: map[reflect.Type]*message{}}
	type kind struct {
		apiVersion, kind string
		t                reflect.Type
	}
	var kinds []kind
	add := func(gvk schema.GroupVersionKind, t reflect.Type) {
		if gvk.Version == runtime.APIVersionInternal || t.Kind() != reflect.Struct {
			return
		}
		kinds = append(kinds, kind{gvk.GroupVersion().String(), gvk.Kind, t})
	}
	for gvk, t := range scheme.Scheme.AllKnownTypes() {
		add(gvk, t)
	}
	// What a watch or an error may carry whatever the resource.
	add(metav1.SchemeGroupVersion.WithKind("Status"), reflect.TypeFor[metav1.Status]())
	add(metav1.SchemeGroupVersion.WithKind("WatchEvent"), reflect.TypeFor[metav1.WatchEvent]())
	sort.Slice(kinds, func(i, j int) bool {
		if kinds[i].apiVersion != kinds[j].apiVersion {
			return kinds[i].apiVersion < kinds[j].apiVersion
		}
		return kinds[i].kind < kinds[j].kind
	})
	for _, k := range kinds {
		w.walk(k.t)
	}

	ok, next, left := w.usable()

	out := &strings.Builder{}
	fmt.Fprintf(out, "# kube-dispatch protobuf table 1: k8s.io/api %s (generated by dispatcher/k8s-protobuf; do not edit)\n", apiVersion())
	for _, t := range w.order {
		if !ok[t] {
			continue
		}
		m := w.types[t]
		fmt.Fprintf(out, "t %d %s.%s\n", m.index, t.PkgPath(), t.Name())
		for _, f := range m.fields {
			shape := f.shape
			if len(f.typeRef) == 1 {
				shape += strconv.Itoa(w.types[f.typeRef[0]].index)
			}
			fmt.Fprintf(out, "f %d %s %s %s\n", f.number, f.name, shape, f.flags)
		}
	}
	written, skipped := 0, 0
	for _, k := range kinds {
		if !ok[k.t] {
			skipped++
			continue
		}
		written++
		fmt.Fprintf(out, "k %s %s %d\n", k.apiVersion, k.kind, w.types[k.t].index)
	}
	if _, err := os.Stdout.WriteString(out.String()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	reasons := make([]string, 0, len(left))
	for r := range left {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	fmt.Fprintf(os.Stderr, "k8s-protobuf: %d kinds, %d types; %d kinds left out\n", written, next, skipped)
	for _, r := range reasons {
		fmt.Fprintln(os.Stderr, "  "+r)
	}
}

// usable says which types are written: those that, with every type they reach, can be
// described. It numbers them in the order they were met, and gives the reasons the others
// cannot be.
func (w *walker) usable() (ok map[reflect.Type]bool, count int, left map[string]bool) {
	ok, left = map[reflect.Type]bool{}, map[string]bool{}
	var reach func(t reflect.Type, seen map[reflect.Type]bool) error
	reach = func(t reflect.Type, seen map[reflect.Type]bool) error {
		m := w.types[t]
		if m.err != nil {
			return m.err
		}
		if seen[t] {
			return nil
		}
		seen[t] = true
		for _, f := range m.fields {
			for _, r := range f.typeRef {
				if err := reach(r, seen); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, t := range w.order {
		if err := reach(t, map[reflect.Type]bool{}); err != nil {
			left[err.Error()] = true
			continue
		}
		ok[t] = true
	}
	for _, t := range w.order {
		if ok[t] {
			w.types[t].index = count
			count++
		}
	}
	return ok, count, left
}

// walk describes t and every message type it reaches.
func (w *walker) walk(t reflect.Type) {
	if _, done := w.types[t]; done {
		return
	}
	m := w.message(t)
	for _, f := range m.fields {
		for _, r := range f.typeRef {
			w.walk(r)
		}
	}
}

// apiVersion is the k8s.io/api module's version this program was built with.
func apiVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "k8s.io/api" {
				return d.Version
			}
		}
	}
	return "(unknown)"
}
