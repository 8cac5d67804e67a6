package render

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
