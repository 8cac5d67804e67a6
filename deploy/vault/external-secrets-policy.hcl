# The Vault policy of External Secrets Operator, for RedisClusters in ExternalSecret mode: it reads
# dynamic credentials and nothing else. keyroll, not ESO, renews and revokes their leases (with its
# own policy, policy.hcl). Narrow "database/creds/*" to the roles ESO's generators use.
path "database/creds/*" {
  capabilities = ["read"]
}
