// Package vault is keyroll's Vault client: it logs in (Kubernetes, AppRole or a static token),
// keeps its own token alive, and issues, renews, looks up and revokes leases of dynamic
// credentials.
//
// It takes plain Go values and returns plain Go values; it knows nothing of Kubernetes objects.
// Every call has a deadline, goes through a token-bucket rate limiter, retries transient failures
// (network errors, 5xx, 429, a sealed or standby Vault) with exponential backoff and jitter, and
// returns errors that are classified (IsPermissionDenied, IsUnavailable, ...) and never carry a
// token, secret ID, service-account token or credential.
//
// The client starts no goroutine: its token is renewed, or a new one obtained, lazily before a
// call once the token is past its renewal point.
package vault
