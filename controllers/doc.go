// Package controllers wires keyroll's two reconcilers (RedisCluster, VaultConnection) into a
// controller-runtime manager: the caches, the Vault clients they share, the metrics, the probes
// and the RBAC the manager needs.
// The two reconcilers (rediscluster, vaultconnection) and what they share (credential,
// connection, render and small helpers) are the packages below it; layout_test.go says which may
// import which (make layout prints it). They translate between the API types and the plain
// Go values of the vault and rotation packages.
package controllers
