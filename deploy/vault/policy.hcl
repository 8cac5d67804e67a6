# The Vault policy of the keyroll operator: least privilege. It reads dynamic credentials from the
# database secrets engine's roles, and renews, looks up and revokes the leases it obtained. keyroll
# names the lease in the URL of a renewal and a revocation (sys/leases/renew/<lease>), so that the
# same prefix limits which leases it may renew and revoke. Narrow "database/creds/*" in all three
# to the roles keyroll may issue from, if not all (for one team: database/creds/team-a.*).
path "database/creds/*" {
  capabilities = ["read"]
}

path "sys/leases/renew/database/creds/*" {
  capabilities = ["update"]
}

path "sys/leases/revoke/database/creds/*" {
  capabilities = ["update"]
}

# A lookup names the lease in the body only: Vault cannot limit it by prefix. It reveals a lease's
# times, never its secret.
path "sys/leases/lookup" {
  capabilities = ["update"]
}

# The operator's own token: renew it before it expires, and read its expiry.
path "auth/token/renew-self" {
  capabilities = ["update"]
}

path "auth/token/lookup-self" {
  capabilities = ["read"]
}
