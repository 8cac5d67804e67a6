package vault

import "sync"

// Cache keeps one client per connection name (a VaultConnection), so that every RedisCluster
// behind a VaultConnection shares its login, its tokens and its rate limit, while two
// VaultConnections never share a client (each has its own tokens, token store and logs). When the
// settings under a name change (Config.Key), the next Get builds a new client; the new one takes
// over the tokens of the old one from the token store. A Cache is safe for concurrent use.
type Cache struct {
	mu      sync.Mutex
	entries map[string]*cacheEntry // by name
}

type cacheEntry struct {
	key    string
	client *Client
}

// NewCache returns an empty cache that builds clients with New.
func NewCache() *Cache {
	return &Cache{entries: make(map[string]*cacheEntry)}
}

// Get returns the client of name for cfg, creating it on first use or when cfg's key differs from
// the one the client was made with. Settings that are not part of the key (Clock, Logger,
// Observer, Tokens, the Kubernetes token source) come from the Get that created the client.
func (c *Cache) Get(name string, cfg Config) (*Client, error) {
	key := cfg.Key()
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[name]; ok && e.key == key {
		return e.client, nil
	}
	cl, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if old, ok := c.entries[name]; ok {
		old.client.closeIdleConnections()
	}
	c.entries[name] = &cacheEntry{key: key, client: cl}
	return cl, nil
}

// Forget drops the client of name (for example, its VaultConnection was deleted).
func (c *Cache) Forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[name]; ok {
		e.client.closeIdleConnections()
		delete(c.entries, name)
	}
}

// Len is the number of clients in the cache.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
