package redisnode

import (
	"strings"
	"testing"
)

// Ready's verdict on each state INFO reports; the states a real Redis passes through are shown by
// controllers/render's probe tests, against real redis-server processes.
func TestReadinessFollowsLoadRoleLinkAndSync(t *testing.T) {
	for _, c := range []struct {
		name, info, want string // want: "" ready, else a word of the reason
	}{
		{"primary loaded", "role:master\r\nloading:0\r\n", ""},
		{"primary loading its snapshot", "role:master\r\nloading:1\r\n", "loading"},
		{"replica linked and synced", "role:slave\r\nloading:0\r\nmaster_host:orders-0\r\nmaster_port:6379\r\nmaster_link_status:up\r\nmaster_sync_in_progress:0\r\n", ""},
		{"replica whose link is down", "role:slave\r\nloading:0\r\nmaster_host:orders-0\r\nmaster_port:6379\r\nmaster_link_status:down\r\nmaster_sync_in_progress:0\r\n", "orders-0:6379 is not up"},
		{"replica taking its first sync", "role:slave\r\nloading:0\r\nmaster_link_status:up\r\nmaster_sync_in_progress:1\r\n", "first sync"},
		{"no loading field", "role:master\r\n", "loading"},
	} {
		err := readiness(c.info)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want ready", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want not ready (%s)", c.name, err, c.want)
		}
	}
}
