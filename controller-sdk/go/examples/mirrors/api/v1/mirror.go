// Package v1 is the Mirror kind (examples.kube-dispatch.dev/v1) of the mirrors example: a
// record, in its status, of the data of the ConfigMap it names.
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the Mirror's group and version.
var GroupVersion = schema.GroupVersion{Group: "examples.kube-dispatch.dev", Version: "v1"}

var (
	// SchemeBuilder registers the Mirror's types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds them to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Mirror{}, &MirrorList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// MirrorSpec names the ConfigMap to mirror.
type MirrorSpec struct {
	// ConfigMapName is the ConfigMap, in the Mirror's namespace.
	ConfigMapName string `json:"configMapName,omitempty"`
}

// MirrorStatus is what the controller saw last.
type MirrorStatus struct {
	// DataHash is a hash of the ConfigMap's data.
	DataHash string `json:"dataHash,omitempty"`
	// ObservedGeneration is the generation it is of.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Mirror records the data of a ConfigMap.
type Mirror struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MirrorSpec   `json:"spec,omitempty"`
	Status MirrorStatus `json:"status,omitempty"`
}

// MirrorList is a list of Mirrors.
type MirrorList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Mirror `json:"items"`
}

// DeepCopyInto copies m into out.
func (m *Mirror) DeepCopyInto(out *Mirror) {
	*out = *m
	m.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
}

// DeepCopyObject is a copy of m.
func (m *Mirror) DeepCopyObject() runtime.Object {
	if m == nil {
		return nil
	}
	out := new(Mirror)
	m.DeepCopyInto(out)
	return out
}

// DeepCopyObject is a copy of l.
func (l *MirrorList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &MirrorList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]Mirror, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
