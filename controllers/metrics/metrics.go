package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics are keyroll's Prometheus metrics, registered in controller-runtime's registry and so
// served on the manager's metrics endpoint. Labels stay low in cardinality: the RedisCluster's
// namespace and name at most, never a lease id.
type Metrics struct {
	Issues          *prometheus.CounterVec
	Renewals        *prometheus.CounterVec
	Rotations       *prometheus.CounterVec
	Revocations     *prometheus.CounterVec
	RolloutDuration prometheus.Histogram
	VaultRequests   *prometheus.HistogramVec
	leaseExpiry     *expiryCollector
	tokenExpiry     *expiryCollector
	stalePods       *prometheus.GaugeVec
	dataPlanePods   *prometheus.GaugeVec
	oldUserConns    *prometheus.GaugeVec
	// RevokedOutside counts live leases found revoked outside keyroll.
	RevokedOutside prometheus.Counter
	// UnknownUsersRemoved counts the Redis users removed from a node that were not its cluster's.
	UnknownUsersRemoved prometheus.Counter
	tokens              *prometheus.GaugeVec
	orphans             *prometheus.GaugeVec
	// OrphanLeasesRevoked counts the orphan leases the sweep revoked, per VaultConnection.
	OrphanLeasesRevoked *prometheus.CounterVec
}

// Result label values.
const (
	resultSuccess = "success"
	resultFailure = "failure"
)

var (
	metricsOnce sync.Once
	metrics     *Metrics
)

// For returns keyroll's metrics, registering them once in controller-runtime's registry.
// Times to expiry are computed at scrape time from clk.
func For(clk clock.PassiveClock) *Metrics {
	metricsOnce.Do(func() {
		metrics = newMetrics(clk)
		ctrlmetrics.Registry.MustRegister(metrics.collectors()...)
	})
	return metrics
}

func newMetrics(clk clock.PassiveClock) *Metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"result"})
	}
	return &Metrics{
		Issues:      counter("keyroll_credential_issues_total", "Credentials issued from Vault, by result."),
		Renewals:    counter("keyroll_lease_renewals_total", "Lease renewals, by result."),
		Rotations:   counter("keyroll_rotations_total", "Rotations started (a new credential replacing a live one), by result."),
		Revocations: counter("keyroll_lease_revocations_total", "Lease revocations, by result; failures stay in the ledger and are retried."),
		RolloutDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "keyroll_rollout_duration_seconds", Help: "Time from the start of a rollout to its last pod and consumer.",
			Buckets: prometheus.ExponentialBuckets(0.5, 2, 14),
		}),
		VaultRequests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "keyroll_vault_request_duration_seconds", Help: "Vault HTTP requests (each attempt), by operation and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"operation", "outcome"}),
		leaseExpiry: newExpiryCollector(clk, prometheus.NewDesc("keyroll_lease_expiry_seconds",
			"Seconds until the current credential's lease expires unless renewed.", []string{"namespace", "name"}, nil)),
		tokenExpiry: newExpiryCollector(clk, prometheus.NewDesc("keyroll_vault_token_expiry_seconds",
			"Seconds until the operator's Vault token of a VaultConnection expires unless renewed.", []string{"connection"}, nil)),
		stalePods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyroll_pods_on_superseded_credential", Help: "Redis pods still running a credential that has been replaced.",
		}, []string{"namespace", "name"}),
		oldUserConns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyroll_unlisted_client_connections", Help: "Connections logged in on the Redis nodes as a superseded credential's user from clients that are not listed consumers: the user's retirement waits for them.",
		}, []string{"namespace", "name"}),
		dataPlanePods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyroll_pods_on_older_data_plane", Help: "Redis pods running an older data-plane contract than this keyroll renders: their restart is pending (maintenance window, or the owner's ask).",
		}, []string{"namespace", "name"}),
		RevokedOutside: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keyroll_leases_revoked_outside_total", Help: "Live leases found revoked outside keyroll (then replaced at once).",
		}),
		UnknownUsersRemoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keyroll_redis_unknown_users_removed_total", Help: "Redis users found on a node that were not its cluster's, and removed.",
		}),
		orphans: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyroll_orphan_leases", Help: "Leases under a VaultConnection's credential paths that no RedisCluster's ledger knows, as the last sweep found.",
		}, []string{"connection"}),
		OrphanLeasesRevoked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyroll_orphan_leases_revoked_total", Help: "Orphan leases the sweep revoked (orphanLeases.action Revoke).",
		}, []string{"connection"}),
		tokens: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyroll_vault_tokens", Help: "Vault tokens the operator holds through a VaultConnection: the current one and those kept alive for their leases.",
		}, []string{"connection"}),
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Issues, m.Renewals, m.Rotations, m.Revocations, m.RolloutDuration,
		m.VaultRequests, m.leaseExpiry, m.tokenExpiry, m.stalePods, m.dataPlanePods, m.oldUserConns, m.RevokedOutside, m.UnknownUsersRemoved, m.tokens, m.orphans, m.OrphanLeasesRevoked}
}

// ObserveVault records one Vault request.
func (m *Metrics) ObserveVault(op, outcome string, seconds float64) {
	m.VaultRequests.WithLabelValues(op, outcome).Observe(seconds)
}

// SetLeaseExpiry records when a cluster's lease expires (zero: forget the cluster).
func (m *Metrics) SetLeaseExpiry(key types.NamespacedName, at time.Time) {
	m.leaseExpiry.set([]string{key.Namespace, key.Name}, at)
}

// SetTokenExpiry records when a connection's Vault token expires (zero: forget it).
func (m *Metrics) SetTokenExpiry(connection string, at time.Time) {
	m.tokenExpiry.set([]string{connection}, at)
}

// SetTokens records how many tokens a VaultConnection holds (0 forgets the series).
func (m *Metrics) SetTokens(connection string, n int) {
	if n == 0 {
		m.tokens.DeleteLabelValues(connection)
		return
	}
	m.tokens.WithLabelValues(connection).Set(float64(n))
}

// SetOrphanLeases records how many orphans a connection's last sweep found (negative forgets the
// series).
func (m *Metrics) SetOrphanLeases(connection string, n int) {
	if n < 0 {
		m.orphans.DeleteLabelValues(connection)
		m.OrphanLeasesRevoked.DeleteLabelValues(connection)
		return
	}
	m.orphans.WithLabelValues(connection).Set(float64(n))
}

// SetStalePods records how many Redis pods still run a superseded credential.
func (m *Metrics) SetStalePods(key types.NamespacedName, n int) {
	m.stalePods.WithLabelValues(key.Namespace, key.Name).Set(float64(n))
}

// SetDataPlanePods records how many Redis pods run an older data-plane contract than this keyroll's
// (0 drops the series: a cluster without a pending change has none).
func (m *Metrics) SetDataPlanePods(key types.NamespacedName, n int) {
	if n == 0 {
		m.dataPlanePods.DeleteLabelValues(key.Namespace, key.Name)
		return
	}
	m.dataPlanePods.WithLabelValues(key.Namespace, key.Name).Set(float64(n))
}

// SetUnlistedClientConnections records how many connections unlisted clients hold as a superseded
// credential's user (0 drops the series).
func (m *Metrics) SetUnlistedClientConnections(key types.NamespacedName, n int) {
	if n == 0 {
		m.oldUserConns.DeleteLabelValues(key.Namespace, key.Name)
		return
	}
	m.oldUserConns.WithLabelValues(key.Namespace, key.Name).Set(float64(n))
}

// Forget drops a deleted cluster's series.
func (m *Metrics) Forget(key types.NamespacedName) {
	m.SetLeaseExpiry(key, time.Time{})
	m.stalePods.DeleteLabelValues(key.Namespace, key.Name)
	m.dataPlanePods.DeleteLabelValues(key.Namespace, key.Name)
	m.oldUserConns.DeleteLabelValues(key.Namespace, key.Name)
}

// Result is the result label of an outcome.
func Result(err error) string {
	if err != nil {
		return resultFailure
	}
	return resultSuccess
}

// expiryCollector reports seconds until stored deadlines, computed when scraped.
type expiryCollector struct {
	clk  clock.PassiveClock
	desc *prometheus.Desc
	mu   sync.Mutex
	at   map[[2]string]time.Time
}

func newExpiryCollector(clk clock.PassiveClock, desc *prometheus.Desc) *expiryCollector {
	return &expiryCollector{clk: clk, desc: desc, at: map[[2]string]time.Time{}}
}

func (c *expiryCollector) set(labels []string, at time.Time) {
	var k [2]string
	copy(k[:], labels)
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.IsZero() {
		delete(c.at, k)
		return
	}
	c.at[k] = at
}

func (c *expiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *expiryCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	for k, at := range c.at {
		labels := k[:]
		if k[1] == "" {
			labels = k[:1]
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, at.Sub(now).Seconds(), labels...)
	}
}
