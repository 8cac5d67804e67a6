# Optional, for the orphan-lease sweep (VaultConnection spec.orphanLeases): lets the keyroll
# operator list the leases under the database roles it issues from, so that a lease issued just
# before the operator was killed (before it reached a RedisCluster's ledger) is found and, with
# orphanLeases.action Revoke, revoked. Listing leases needs sudo. Narrow "database/creds/*" to the
# roles keyroll issues from: every lease under a swept role that no ledger knows counts as an
# orphan, so those roles must be keyroll's alone. Attach it to the operator's auth role beside
# policy.hcl.
path "sys/leases/lookup/database/creds/*" {
  capabilities = ["list", "sudo"]
}
