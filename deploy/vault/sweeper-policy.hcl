# Optional, for the orphan-lease sweep (VaultConnection spec.orphanLeases): lets the keyroll
# operator list the leases under the database roles it issues from, so that a lease issued just
# before the operator was killed (before it reached a RedisCluster's ledger) is found and, with
# orphanLeases.action Revoke, revoked (only a lease whose issue keyroll recorded beforehand: never
# one another install or a person obtained). Listing leases needs sudo. Narrow "database/creds/*"
# to the roles keyroll issues from. Attach it to the operator's auth role beside policy.hcl.
path "sys/leases/lookup/database/creds/*" {
  capabilities = ["list", "sudo"]
}
