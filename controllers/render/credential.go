package render

import corev1 "k8s.io/api/core/v1"

// Credential is a Redis credential, in memory only: never logged, put in an event or a status.
type Credential struct {
	Username, Password string
	// Version identifies the credential without revealing it (CredentialVersion).
	Version string
}

// NewCredential is the credential of a username and password, with its version.
func NewCredential(username, password string) Credential {
	return Credential{Username: username, Password: password, Version: CredentialVersion(username, password)}
}

// StagedCredential is the credential the state Secret (StateSecret) holds, or nil.
func StagedCredential(state *corev1.Secret) *Credential {
	u, p := string(state.Data[StateUsernameKey]), string(state.Data[StatePasswordKey])
	if u == "" || p == "" {
		return nil
	}
	c := NewCredential(u, p)
	return &c
}
