package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RedisCluster runs Redis with a credential from Vault that is renewed, rotated on a schedule and
// rolled out to its pods and consumers one at a time, each only while the previous one is Ready.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Namespaced,shortName=rdc,categories=keyroll
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 52",message="metadata.name must be at most 52 characters: the Redis pods' controller-revision-hash label is the name and 11 more characters, and must fit in 63"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.credentials.secretName) || !(self.spec.credentials.secretName in [self.metadata.name + '-acl', self.metadata.name + '-keyroll', self.metadata.name + '-eso', self.metadata.name + '-vault-plugin', self.metadata.name + '-tls', self.metadata.name + '-tls-ca'])",message="spec.credentials.secretName must not be <name>-acl, <name>-keyroll, <name>-eso, <name>-vault-plugin, <name>-tls or <name>-tls-ca: keyroll writes those Secrets itself",fieldPath=".spec.credentials.secretName"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.status.credential.lease.expiresAt`
// +kubebuilder:printcolumn:name="Next-Rotation",type=string,JSONPath=`.status.credential.nextRotation`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.credentials.source`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RedisCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state.
	// +required
	Spec RedisClusterSpec `json:"spec"`

	// status is the observed state.
	// +optional
	Status RedisClusterStatus `json:"status,omitempty"`
}

// RedisClusterList is a list of RedisClusters.
//
// +kubebuilder:object:root=true
type RedisClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RedisCluster `json:"items"`
}
