package render

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
)

// The ExternalSecret keyroll owns, and reading what External Secrets Operator wrote: plain
// functions from the spec or the Secret, tested without a cluster.

// Keys of the raw Vault response that a VaultDynamicSecret with resultType Raw writes.
const (
	rawDataKey      = "data"
	RawLeaseIDKey   = "lease_id"
	rawDurationKey  = "lease_duration"
	rawRenewableKey = "renewable"
)

// syncedCredential is what ESO wrote into the credentials Secret.
type SyncedCredential struct {
	Credential
	// leaseID, leaseDuration and renewable come from a raw Vault response; leaseID is empty otherwise.
	LeaseID       string
	LeaseDuration time.Duration
	Renewable     bool
}

func ExternalSecretName(rc *v1beta1.RedisCluster) string { return rc.Name }

// SyncedSecretName is the Secret External Secrets Operator writes for rc: only keyroll reads it,
// and publishes the credential to the consumers' Secret once every Redis node accepts it.
func SyncedSecretName(rc *v1beta1.RedisCluster) string { return rc.Name + "-eso" }

// ExternalSecret is the ExternalSecret keyroll owns: it targets the synced Secret, which ESO
// creates and owns, and which no consumer reads. The template adds the username and password keys (taken from the raw
// response's data when the generator hands over the raw response) and keyroll's labels, so that
// the operator's Secret cache sees the Secret.
func ExternalSecret(rc *v1beta1.RedisCluster) *externalsecrets.ExternalSecret {
	src := rc.Spec.Credentials.ExternalSecret
	es := &externalsecrets.ExternalSecret{
		ObjectMeta: objectMeta(rc, ExternalSecretName(rc)),
		Spec: externalsecrets.ExternalSecretSpec{
			RefreshInterval: src.RefreshInterval,
			RefreshPolicy:   src.RefreshPolicy,
			Target: externalsecrets.Target{
				Name:           SyncedSecretName(rc),
				CreationPolicy: externalsecrets.CreationPolicyOwner,
				Template: &externalsecrets.Template{
					EngineVersion: externalsecrets.TemplateEngineV2,
					MergePolicy:   externalsecrets.MergePolicyMerge,
					Metadata:      externalsecrets.TemplateMetadata{Labels: OwnedLabels(rc)},
					Data: map[string]string{
						rc.Spec.Credentials.UsernameKey: credentialField("username"),
						rc.Spec.Credentials.PasswordKey: credentialField("password"),
					},
				},
			},
		},
	}
	from := externalsecrets.DataFrom{}
	if g := src.GeneratorRef; g != nil {
		from.SourceRef = &externalsecrets.SourceRef{GeneratorRef: &externalsecrets.GeneratorRef{APIVersion: g.APIVersion, Kind: g.Kind, Name: g.Name}}
	} else {
		es.Spec.SecretStoreRef = externalsecrets.SecretStoreRef{Name: src.StoreRef.Name, Kind: src.StoreRef.Kind}
		from.Extract = &externalsecrets.RemoteRef{Key: src.RemoteKey}
	}
	es.Spec.DataFrom = []externalsecrets.DataFrom{from}
	return es
}

// credentialField is an ESO template for one field of the credential: from the JSON in "data"
// when the generator hands over the raw Vault response, else the field as it is.
func credentialField(field string) string {
	return fmt.Sprintf(`{{ if index . %q }}{{ (index . %q | fromJson).%s }}{{ else }}{{ index . %q }}{{ end }}`,
		rawDataKey, rawDataKey, field, field)
}

// syncedByExternalSecret says whether a Secret is controlled by the ExternalSecret of rc.
func SyncedByExternalSecret(sec *corev1.Secret, rc *v1beta1.RedisCluster) bool {
	ref := metav1.GetControllerOf(sec)
	return ref != nil && ref.Kind == "ExternalSecret" && ref.Name == ExternalSecretName(rc) &&
		rc.Spec.Credentials.Source == v1beta1.SourceExternalSecret && sec.Name == SyncedSecretName(rc)
}

// parseSynced reads the credential ESO wrote. It returns a message naming what is missing when
// the Secret holds no usable credential.
func ParseSynced(sec *corev1.Secret, rc *v1beta1.RedisCluster) (*SyncedCredential, string) {
	sc := &SyncedCredential{}
	u, p := string(sec.Data[rc.Spec.Credentials.UsernameKey]), string(sec.Data[rc.Spec.Credentials.PasswordKey])
	if raw, ok := sec.Data[rawDataKey]; ok && len(sec.Data[RawLeaseIDKey]) > 0 {
		var data struct{ Username, Password string }
		if err := json.Unmarshal(raw, &data); err != nil {
			return nil, fmt.Sprintf("Secret %s: key %q is not the JSON of a Vault response's data", sec.Name, rawDataKey)
		}
		u, p = data.Username, data.Password
		sc.LeaseID = string(sec.Data[RawLeaseIDKey])
		secs, err := strconv.ParseFloat(string(sec.Data[rawDurationKey]), 64)
		if err != nil || secs < 0 {
			return nil, fmt.Sprintf("Secret %s: key %q is not a number of seconds", sec.Name, rawDurationKey)
		}
		sc.LeaseDuration = time.Duration(secs * float64(time.Second))
		sc.Renewable, _ = strconv.ParseBool(string(sec.Data[rawRenewableKey]))
	}
	if u == "" || p == "" {
		return nil, fmt.Sprintf("Secret %s has no username and password under keys %q and %q (credentials.usernameKey, credentials.passwordKey) nor a raw Vault response",
			sec.Name, rc.Spec.Credentials.UsernameKey, rc.Spec.Credentials.PasswordKey)
	}
	if !usernamePattern.MatchString(u) {
		return nil, fmt.Sprintf("Secret %s: the username is not a valid Redis user name", sec.Name)
	}
	sc.Credential = Credential{Username: u, Password: p, Version: CredentialVersion(u, p)}
	return sc, ""
}
