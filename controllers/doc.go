// Package controllers holds keyroll's reconcilers: one per Kind (RedisCluster, VaultConnection).
// They translate between the API types and the plain Go values of the vault and rotation packages.
package controllers
