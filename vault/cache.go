package vault

import "sync"

// Cache shares clients between the users of the same connection and login settings, so that a
// thousand RedisClusters behind one VaultConnection share one login and one rate limit. Clients
// are keyed by Config.Key: a changed address, CA, namespace, role or secret gives a new client.
// A Cache is safe for concurrent use.
type Cache struct {
	newClient func(Config) (Client, error)

	mu      sync.Mutex
	entries map[string]*cacheEntry // by Config.Key
	names   map[string]string      // user name -> key
}

type cacheEntry struct {
	client Client
	users  map[string]struct{}
}

// NewCache returns an empty cache that builds clients with New.
func NewCache() *Cache {
	return newCache(New)
}

func newCache(newClient func(Config) (Client, error)) *Cache {
	return &Cache{newClient: newClient, entries: make(map[string]*cacheEntry), names: make(map[string]string)}
}

// Get returns the client for cfg, creating it on first use. name says who uses the settings (for
// example the VaultConnection's name): when the settings under a name change, the client of the
// former settings is dropped as soon as no name uses it any more. Settings that are not part of
// the key (Clock, Logger, Observer, the Kubernetes token source) come from the first Get.
func (c *Cache) Get(name string, cfg Config) (Client, error) {
	key := cfg.Key()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		cl, err := c.newClient(cfg)
		if err != nil {
			return nil, err
		}
		e = &cacheEntry{client: cl, users: make(map[string]struct{})}
		c.entries[key] = e
	}
	if old, ok := c.names[name]; ok && old != key {
		c.release(name, old)
	}
	c.names[name] = key
	e.users[name] = struct{}{}
	return e.client, nil
}

// Forget says that name no longer uses any client (for example, its VaultConnection was deleted).
func (c *Cache) Forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if key, ok := c.names[name]; ok {
		c.release(name, key)
		delete(c.names, name)
	}
}

// Len is the number of clients in the cache.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// release removes name from the users of key's client, and drops the client when it was the last.
func (c *Cache) release(name, key string) {
	e, ok := c.entries[key]
	if !ok {
		return
	}
	delete(e.users, name)
	if len(e.users) > 0 {
		return
	}
	delete(c.entries, key)
	if cl, ok := e.client.(interface{ closeIdleConnections() }); ok {
		cl.closeIdleConnections()
	}
}
