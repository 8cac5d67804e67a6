// Package vaultconnection is the VaultConnection reconciler: the login and its health, the tokens
// that own leases kept alive, the namespaces a connection serves, and the orphan-lease sweep.
package vaultconnection
