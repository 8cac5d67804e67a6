package redisnode

import (
	"context"
	"strings"
)

// Conn is one client connection of a node.
type Conn struct {
	// User is the user it is logged in as.
	User string
	// Addr is the client's address, ip:port, as the node sees it.
	Addr string
}

// Clients reads CLIENT LIST.
func (n *Client) Clients(ctx context.Context) ([]Conn, error) {
	out, err := n.c.Do(ctx, "CLIENT", "LIST").Text()
	if err != nil {
		return nil, n.wrap("reading CLIENT LIST", err)
	}
	return ParseClientList(out), nil
}

// ParseClientList reads CLIENT LIST's lines: space-separated key=value fields, of which it keeps
// the user and the address.
func ParseClientList(out string) []Conn {
	var conns []Conn
	for _, line := range strings.Split(out, "\n") {
		var c Conn
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "user":
				c.User = v
			case "addr":
				c.Addr = v
			}
		}
		if c.Addr != "" {
			conns = append(conns, c)
		}
	}
	return conns
}
