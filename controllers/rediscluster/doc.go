// Package rediscluster is the RedisCluster reconciler, each phase a file, in the order a reconcile
// runs them: the credential first (reconcile.go, through controllers/credential), the owned objects
// (objects.go, netpol.go), the users on every Redis node (users.go, nodes*.go), the one primary
// (primary*.go), the rollout to the consumers and the Redis pods (rollout_*.go), the retirement of
// what a rotation replaced (reconcile.go), deletion (delete.go), the status summary (summary.go)
// and the watches (watches.go).
package rediscluster
