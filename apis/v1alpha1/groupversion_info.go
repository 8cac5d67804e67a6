// Package v1alpha1 holds the keyroll.dev/v1alpha1 API, deprecated (served, converted to and from
// v1beta1, the storage version, by the conversion webhook): RedisCluster (namespaced), for owners of Redis
// clusters whose credentials come from Vault, and VaultConnection (cluster-scoped), for Vault
// administrators. It imports nothing else of keyroll's.
//
// +kubebuilder:object:generate=true
// +groupName=keyroll.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "keyroll.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a runtime.Scheme. It is apimachinery's,
	// not controller-runtime's (deprecated for API packages), so that the package needs nothing
	// of controller-runtime.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &RedisCluster{}, &RedisClusterList{}, &VaultConnection{}, &VaultConnectionList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})

	// AddToScheme adds the types of this API to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
