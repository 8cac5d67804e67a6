package rediscluster

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"time"

	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/upkeep"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/vault"
)

// Reconciler reconciles RedisClusters: credentials from Vault, the Redis StatefulSet and
// the Secrets it mounts, renewals, re-issues and revocation on delete.
type Reconciler struct {
	*deps
	Recorder events.EventRecorder
	// ExternalSecrets says that External Secrets Operator's ExternalSecret API was there when
	// keyroll started: only then does ExternalSecret mode work (and is the API watched).
	ExternalSecrets bool
	// Workers is how many RedisClusters are reconciled at once.
	Workers        int
	rollout        *Engine
	upkeep         *upkeep.Timers
	vaultLease     *credential.Issuer
	externalSecret *credential.Adopter
}

// deps are what the phases of a reconcile share: the clients, the clock, the metrics, the Vault
// connector, and what is kept in memory between reconciles.
type deps struct {
	client.Client
	// APIReader reads past the cache, where a stale cache could make keyroll issue a second
	// credential or overwrite a Secret it does not own.
	APIReader client.Reader
	Clock     clock.Clock
	Connector *connection.Connector
	Metrics   *metrics.Metrics
	Ledger    *credential.Ledger
	// nodes changes the users on the Redis nodes.
	nodes   *usersSyncer
	primary *primaryKeeper
	netpol  *netpolKeeper
	// tls says how the nodes of each TLS cluster are checked; servedCertificate asks a node which
	// certificate it serves.
	tls               *nodeTLS
	servedCertificate servedCertificate
	// probeImage is the image of the Redis pods' probe sidecar.
	probeImage string
}

// source is where a RedisCluster's credential comes from: a Vault lease keyroll holds
// (credential.Issuer) or External Secrets Operator (credential.Adopter).
type source interface {
	// Credential brings the credential up to date (issue, adopt, renew, look up, refresh) and
	// returns it; nil while there is none. It says when to look again. vcl is the Vault client of
	// the cluster's VaultConnection, nil when it has none.
	Credential(ctx context.Context, c *credential.Cluster, vcl vault.LeaseClient) (*render.Credential, time.Duration, error)
	// Retire stops the source before the cluster's leases are revoked on delete, and says how
	// long to wait for it.
	Retire(ctx context.Context, c *credential.Cluster) (time.Duration, error)
}

// Both credential sources are sources.
var _, _ source = (*credential.Issuer)(nil), (*credential.Adopter)(nil)

// DefaultLeaseCheckInterval is how often a live lease is looked up in Vault besides its renewals
// (Config.LeaseCheckInterval zero).
const DefaultLeaseCheckInterval = credential.DefaultLeaseCheckInterval

// DefaultWorkers is how many RedisClusters are reconciled at once by default: enough that a slow
// Vault call for one cluster does not hold up a thousand others.
const DefaultWorkers = 16

// Config is what a Reconciler is made of.
type Config struct {
	Client          client.Client
	APIReader       client.Reader
	Recorder        events.EventRecorder
	Clock           clock.Clock
	Connector       *connection.Connector
	Metrics         *metrics.Metrics
	ExternalSecrets bool
	// Workers is how many RedisClusters are reconciled at once (zero: DefaultWorkers).
	Workers int
	// LeaseCheckInterval is how often a live lease is looked up (zero: DefaultLeaseCheckInterval;
	// negative: never).
	LeaseCheckInterval time.Duration
	// UsersCheckInterval is how often nodes' ACLs are checked (zero: DefaultUsersCheckInterval).
	UsersCheckInterval time.Duration
	// DialRedis opens a connection to one Redis node (nil: redisnode.Dial, the real ones).
	DialRedis redisnode.Dialer
	// ServedCertificate asks a TLS node which certificate it serves (nil:
	// redisnode.ServedCertificate, the real ones).
	ServedCertificate func(ctx context.Context, addr string, conf *tls.Config) (*x509.Certificate, error)
	// ProbeImage is the image of the Redis pods' probe sidecar (cmd/keyroll-probe): the manager's
	// own.
	ProbeImage string
	// OperatorNamespace is where keyroll's manager pods run: a cluster's NetworkPolicy admits
	// them (empty: keyroll-system).
	OperatorNamespace string
}

// New returns a Reconciler for cfg.
func New(cfg Config) *Reconciler {
	interval := cfg.LeaseCheckInterval
	if interval == 0 {
		interval = DefaultLeaseCheckInterval
	}
	dial := cfg.DialRedis
	if dial == nil {
		dial = redisnode.Dial
	}
	timers := upkeep.NewTimers(delayedExecution(cfg.Clock))
	nodeTLS := &nodeTLS{}
	if cfg.ServedCertificate == nil {
		cfg.ServedCertificate = redisnode.ServedCertificate
	}
	checks := credential.NewLeaseChecks(interval)
	d := &deps{Client: cfg.Client, APIReader: cfg.APIReader, Clock: cfg.Clock, Connector: cfg.Connector,
		Metrics: cfg.Metrics, Ledger: &credential.Ledger{Clock: cfg.Clock, Metrics: cfg.Metrics, Checks: checks, Upkeep: timers, Connections: cfg.Connector, Reader: cfg.Client},
		nodes: newUsersSyncer(cfg.Client, cfg.APIReader, dial, cfg.Clock, cfg.UsersCheckInterval, cfg.Metrics.UnknownUsersRemoved, checks.Now), primary: &primaryKeeper{Client: cfg.Client, Dial: dial, TLS: nodeTLS, Clock: cfg.Clock},
		tls: nodeTLS, servedCertificate: cfg.ServedCertificate,
		netpol:     &netpolKeeper{Client: cfg.Client, APIReader: cfg.APIReader, OperatorNamespace: cmp.Or(cfg.OperatorNamespace, "keyroll-system")},
		probeImage: cfg.ProbeImage}
	d.nodes.TLS = nodeTLS
	workers := cmp.Or(max(cfg.Workers, 0), DefaultWorkers)
	vl := &credential.Issuer{Client: d.Client, APIReader: d.APIReader, Clock: d.Clock, Metrics: d.Metrics, Ledger: d.Ledger}
	if cfg.Connector != nil && cfg.Connector.Intents != nil {
		vl.Intents = cfg.Connector.Intents
	}
	return &Reconciler{
		deps: d, Recorder: cfg.Recorder, ExternalSecrets: cfg.ExternalSecrets, Workers: workers, upkeep: timers,
		rollout:        &Engine{Client: d.Client, APIReader: d.APIReader, Clock: d.Clock, Metrics: d.Metrics, Primary: d.primary, ProbeImage: d.probeImage},
		vaultLease:     vl,
		externalSecret: credential.NewAdopter(d.Client, d.APIReader, d.Clock, d.Metrics, d.Ledger),
	}
}

// WithClient returns a copy of r whose every phase writes through c (tests count the writes of a
// reconcile with it).
func (r *Reconciler) WithClient(c client.Client) *Reconciler {
	out := New(Config{Client: c, APIReader: r.APIReader, Recorder: r.Recorder, Clock: r.Clock, Connector: r.Connector,
		Metrics: r.Metrics, ExternalSecrets: r.ExternalSecrets, DialRedis: r.nodes.Dial, UsersCheckInterval: r.nodes.CheckInterval, OperatorNamespace: r.netpol.OperatorNamespace,
		ProbeImage: r.probeImage})
	out.Ledger, out.externalSecret, out.upkeep, out.nodes = r.Ledger, r.externalSecret.WithClient(c), r.upkeep, r.nodes // the same memory as r (nodes writes nothing)
	out.vaultLease.Ledger = r.Ledger
	return out
}

// delayedExecution is clk, or the real clock where clk cannot run a function later.
func delayedExecution(clk clock.Clock) clock.WithDelayedExecution {
	if d, ok := clk.(clock.WithDelayedExecution); ok {
		return d
	}
	return clock.RealClock{}
}

// source is the cluster's credential source.
func (r *Reconciler) source(rc *v1beta1.RedisCluster) source {
	if rc.Spec.Credentials.Source == v1beta1.SourceExternalSecret {
		return r.externalSecret
	}
	return r.vaultLease
}
