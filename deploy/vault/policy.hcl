# The Vault policy of the keyroll operator: least privilege. It reads dynamic credentials from the
# database secrets engine's roles, and renews, looks up and revokes the leases it obtained. Narrow
# "database/creds/*" to the roles keyroll may issue from, if not all.
path "database/creds/*" {
  capabilities = ["read"]
}

path "sys/leases/renew" {
  capabilities = ["update"]
}

path "sys/leases/lookup" {
  capabilities = ["update"]
}

path "sys/leases/revoke" {
  capabilities = ["update"]
}

# The operator's own token: renew it before it expires, and read its expiry.
path "auth/token/renew-self" {
  capabilities = ["update"]
}

path "auth/token/lookup-self" {
  capabilities = ["read"]
}
