// Package v1 is the Bundle kind (examples.kube-dispatch.dev/v1) of the bundles example: a
// number of identical ConfigMaps, named after the Bundle, that its controller keeps.
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the Bundle's group and version.
var GroupVersion = schema.GroupVersion{Group: "examples.kube-dispatch.dev", Version: "v1"}

var (
	// SchemeBuilder registers the Bundle's types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds them to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Bundle{}, &BundleList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// BundleSpec is what a Bundle asks for.
type BundleSpec struct {
	// Copies is how many ConfigMaps hold Data: <bundle>-0 to <bundle>-<copies-1>.
	Copies int32 `json:"copies,omitempty"`
	// Data is what each copy holds.
	Data map[string]string `json:"data,omitempty"`
}

// BundleStatus is what the controller saw last.
type BundleStatus struct {
	// ReadyCopies is how many copies hold Data.
	ReadyCopies int32 `json:"readyCopies,omitempty"`
	// ObservedGeneration is the generation those figures are of.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Bundle is a set of identical ConfigMaps.
type Bundle struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BundleSpec   `json:"spec,omitempty"`
	Status BundleStatus `json:"status,omitempty"`
}

// BundleList is a list of Bundles.
type BundleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Bundle `json:"items"`
}

// DeepCopyInto copies b into out.
func (b *Bundle) DeepCopyInto(out *Bundle) {
	*out = *b
	out.TypeMeta = b.TypeMeta
	b.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if b.Spec.Data != nil {
		out.Spec.Data = make(map[string]string, len(b.Spec.Data))
		for k, v := range b.Spec.Data {
			out.Spec.Data[k] = v
		}
	}
}

// DeepCopy is a copy of b.
func (b *Bundle) DeepCopy() *Bundle {
	if b == nil {
		return nil
	}
	out := new(Bundle)
	b.DeepCopyInto(out)
	return out
}

// DeepCopyObject is a copy of b.
func (b *Bundle) DeepCopyObject() runtime.Object {
	if c := b.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyObject is a copy of l.
func (l *BundleList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &BundleList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]Bundle, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
