// Package externalsecrets is the part of External Secrets Operator's API that keyroll reads and
// writes: the ExternalSecret of external-secrets.io/v1, with only the fields keyroll sets (the
// target, its template, the store or generator it reads from, the refresh policy) and reads (the
// Ready condition). It imports nothing else of keyroll's.
//
// It is a typed view registered under ESO's group, version and kind, rather than unstructured
// objects, because keyroll's writes are server-side applies of the fields it sets, its reads go
// through the manager's typed cache and Owns watch, and its tests build objects in Go: typed,
// each of those stays the one line it is for any other kind, and a field name is checked by the
// compiler rather than at run time. ESO's own Go module is not imported: it pins the
// controller-runtime and Kubernetes libraries of its release, so importing it held keyroll to them
// and to exactly one ESO release. A field this view lacks is one keyroll neither sets nor
// reads; the API server keeps it (applies send only the fields here), and every ESO release that
// serves external-secrets.io/v1 reads what keyroll writes. test/audit creates every shape keyroll
// renders on the API server with ESO's CRDs and strict field validation, so a misspelt field
// here fails there.
//
// +kubebuilder:object:generate=true
// +kubebuilder:skip
package externalsecrets

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is ESO's API that keyroll uses.
	GroupVersion = schema.GroupVersion{Group: "external-secrets.io", Version: "v1"}

	// SchemeBuilder registers ExternalSecret under ESO's group, version and kind.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &ExternalSecret{}, &ExternalSecretList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})

	// AddToScheme adds ExternalSecret to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Kind is the ExternalSecret's kind.
const Kind = "ExternalSecret"

// The values of the fields keyroll sets, as ESO's CRD spells them.
const (
	RefreshPolicyPeriodic    = "Periodic"
	RefreshPolicyCreatedOnce = "CreatedOnce"
	CreationPolicyOwner      = "Owner"
	TemplateEngineV2         = "v2"
	MergePolicyMerge         = "Merge"
	ConditionReady           = "Ready"
)

// ExternalSecret asks ESO to write a Secret from a store or a generator.
//
// +kubebuilder:object:root=true
type ExternalSecret struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ExternalSecretSpec   `json:"spec,omitempty"`
	Status ExternalSecretStatus `json:"status,omitempty"`
}

// ExternalSecretList is a list of ExternalSecrets.
//
// +kubebuilder:object:root=true
type ExternalSecretList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ExternalSecret `json:"items"`
}

// ExternalSecretSpec holds the spec fields keyroll sets. SecretStoreRef is a value, not a
// pointer, as in ESO's types, so that what keyroll applies has the shape earlier releases applied
// (an empty secretStoreRef with a generator) and an upgrade changes nothing.
type ExternalSecretSpec struct {
	SecretStoreRef  SecretStoreRef   `json:"secretStoreRef,omitempty"`
	Target          Target           `json:"target,omitempty"`
	RefreshPolicy   string           `json:"refreshPolicy,omitempty"`
	RefreshInterval *metav1.Duration `json:"refreshInterval,omitempty"`
	DataFrom        []DataFrom       `json:"dataFrom,omitempty"`
}

// SecretStoreRef names a SecretStore or ClusterSecretStore.
type SecretStoreRef struct {
	Name string `json:"name,omitempty"`
	Kind string `json:"kind,omitempty"`
}

// Target is the Secret ESO writes.
type Target struct {
	Name           string    `json:"name,omitempty"`
	CreationPolicy string    `json:"creationPolicy,omitempty"`
	Template       *Template `json:"template,omitempty"`
}

// Template shapes the target Secret. Metadata is a value, as in ESO's types (see
// ExternalSecretSpec).
type Template struct {
	EngineVersion string            `json:"engineVersion,omitempty"`
	Metadata      TemplateMetadata  `json:"metadata,omitempty"`
	MergePolicy   string            `json:"mergePolicy,omitempty"`
	Data          map[string]string `json:"data,omitempty"`
}

// TemplateMetadata is the target Secret's metadata.
type TemplateMetadata struct {
	Labels map[string]string `json:"labels,omitempty"`
}

// DataFrom is where the whole Secret comes from: a key of the store, or a generator.
type DataFrom struct {
	Extract   *RemoteRef `json:"extract,omitempty"`
	SourceRef *SourceRef `json:"sourceRef,omitempty"`
}

// RemoteRef is a key of the store.
type RemoteRef struct {
	Key string `json:"key"`
}

// SourceRef points at a generator.
type SourceRef struct {
	GeneratorRef *GeneratorRef `json:"generatorRef,omitempty"`
}

// GeneratorRef names a generator object of the ExternalSecret's namespace.
type GeneratorRef struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
}

// ExternalSecretStatus holds what keyroll reads of ESO's status.
type ExternalSecretStatus struct {
	Conditions []Condition `json:"conditions,omitempty"`
}

// Condition is one of ESO's conditions (keyroll reads Ready).
type Condition struct {
	Type    string                 `json:"type"`
	Status  corev1.ConditionStatus `json:"status"`
	Reason  string                 `json:"reason,omitempty"`
	Message string                 `json:"message,omitempty"`
}

// Ready is the ExternalSecret's Ready condition, or nil.
func (es *ExternalSecret) Ready() *Condition {
	for i := range es.Status.Conditions {
		if es.Status.Conditions[i].Type == ConditionReady {
			return &es.Status.Conditions[i]
		}
	}
	return nil
}
