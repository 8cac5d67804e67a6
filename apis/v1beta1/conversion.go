package v1beta1

// v1beta1 is the hub of keyroll.dev's versions: the storage version, which every other converts to
// and from (apis/v1alpha1's conversion.go).

// Hub marks RedisCluster as the version others convert through.
func (*RedisCluster) Hub() {}

// Hub marks VaultConnection as the version others convert through.
func (*VaultConnection) Hub() {}
