package redisnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
)

// The health of the node a probe sidecar sits beside, as the kubelet's probes want it: each check
// opens a connection of its own as the probe user, asks once and closes it.

// Ready says whether the node at addr serves its data: nil when it does, else why not. No node is
// ready while it loads its dataset (INFO answers then, with role:master on a primary that loads its
// snapshot); a primary is ready once it has loaded; a replica only once its link to the primary is
// up and its first sync is done, so that a rollout never takes a replica for ready while it has no
// data.
func Ready(ctx context.Context, addr, username, password string, tlsConf *tls.Config) error {
	c := newClient(options(addr, username, password, tlsConf))
	defer func() { _ = c.Close() }()
	info, err := c.Info(ctx).Result() // the default sections: server, replication, persistence...
	if err != nil {
		return fmt.Errorf("reading INFO: %w", err)
	}
	return readiness(info)
}

// readiness is Ready's verdict on INFO's text.
func readiness(info string) error {
	r := ParseReplication(info)
	switch {
	case InfoFields(info)["loading"] != "0":
		return errors.New("loading its dataset")
	case r.Role == "master":
		return nil
	case !r.LinkUp:
		return fmt.Errorf("a replica whose link to its primary %s:%d is not up", r.MasterHost, r.MasterPort)
	case r.SyncInProgress:
		return errors.New("a replica still taking its first sync")
	}
	return nil
}

// Alive says whether the node at addr runs: nil on any answer of a Redis that runs, PONG, LOADING
// (it loads its dataset, from disk or from its primary) or MASTERDOWN, which a restart would only
// start again; an error on no answer (a hung Redis: ctx's deadline) or no Redis to answer.
func Alive(ctx context.Context, addr, username, password string, tlsConf *tls.Config) error {
	c := newClient(options(addr, username, password, tlsConf))
	defer func() { _ = c.Close() }()
	err := c.Ping(ctx).Err()
	if err == nil || isReply(err, "LOADING") || isReply(err, "MASTERDOWN") {
		return nil
	}
	return fmt.Errorf("PING: %w", err)
}
