// Package credential holds a RedisCluster's credential: its two sources and the lease ledger
// they share.
//
//   - Issuer (credentials.source VaultLease): keyroll reads the Vault path itself, records the
//     lease in the ledger before anything uses it, renews it, honours a revocation made outside
//     keyroll, and rotates before the lease or its token ends.
//   - Adopter (credentials.source ExternalSecret): External Secrets Operator syncs the credential
//     through an ExternalSecret keyroll owns; keyroll adopts each credential ESO writes and, when
//     the generator hands over the raw Vault response, takes the lease into the ledger to renew
//     and revoke it (ESO does neither).
//   - Ledger: renews, looks up and revokes the leases recorded in the status (the current one and
//     the superseded ones a rollout still needs), tells rotation.Decide what the ledger says, and
//     remembers when each live lease was last confirmed in Vault.
//
// Cluster is one reconcile's state of a RedisCluster, which the RedisCluster reconciler and the
// sources share.
package credential
