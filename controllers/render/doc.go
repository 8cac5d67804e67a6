// Package render builds the objects a RedisCluster owns (StatefulSet, Services, ConfigMap and start
// script, aclfile, Secrets, NetworkPolicy, PodDisruptionBudget, ExternalSecret) as plain functions
// from the spec, without a client.
package render
