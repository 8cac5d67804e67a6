// Package render builds the objects a RedisCluster owns (StatefulSet, Services, ConfigMap and start
// script, aclfile, Secrets, NetworkPolicy, PodDisruptionBudget, ExternalSecret) as plain functions
// from the spec, without a client. The in-memory credential (Credential) is defined here, the
// lowest package that writes it (into the aclfile and the Secrets): controllers/credential, which
// obtains it, and controllers/rediscluster, which delivers it, both import render.
package render
