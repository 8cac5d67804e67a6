// Package vault is keyroll's Vault client: it logs in (Kubernetes, AppRole or a static token),
// keeps its tokens alive, and issues, renews, looks up and revokes leases of dynamic credentials.
//
// It takes plain Go values and returns plain Go values; it knows nothing of Kubernetes objects.
// Its callers see it through two narrow interfaces: LeaseClient (the RedisCluster controller) and
// ConnectionClient (the VaultConnection controller); New returns a *Client, which implements both.
//
// It is built on vault/api's own pieces: the Sys() lease and health calls, the token's renew-self
// and lookup-self, the Kubernetes and AppRole auth helpers, and the API client's rate limiter.
// Every call has a deadline (Config.Timeout at the latest), makes one request and does not retry:
// it fails at once with an error that is classified (IsPermissionDenied, IsUnavailable, ...), so
// that the caller's workqueue backoff or requeue tries again, and that never carries a token,
// secret ID, service-account token, credential or response body.
//
// The client starts no goroutine: its token is renewed, or a new one obtained, lazily before a
// call once the token is past its renewal point, and KeepTokens renews the tokens that own leases.
package vault
