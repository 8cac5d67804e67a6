// Package apply writes what keyroll owns: the objects a RedisCluster owns, by server-side apply and
// only when a field keyroll owns differs (a steady state writes nothing), refusing an object of that
// name that is not keyroll's; and the status, as a merge patch against the object last written.
package apply
