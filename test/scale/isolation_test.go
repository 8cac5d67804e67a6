package scale

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// isolationSize is BenchmarkIsolation's cluster count (KEYROLL_ISOLATION_SIZE, default 1,000),
// half through each VaultConnection.
var isolationSize = envInt("KEYROLL_ISOLATION_SIZE", 1000)

// faultyConnection is the VaultConnection whose address is a proxy in front of the ground's Vault,
// the one the benchmark blackholes; the healthy half goes through the run's own ("scale").
const faultyConnection = "faulty"

// The name prefixes of the two halves.
const healthyPrefix, faultyPrefix = "healthy-", "faulty-"

// blackholeWatch is how long after the first create the blackholed half is watched for the
// reasons it reports, once the healthy half is done (it never becomes CredentialsReady).
const blackholeWatch = 3 * time.Minute

// isolationHead is the head of the docs' isolation table, and isolationRow its row from the last
// BenchmarkIsolation (empty unless both of its runs finished).
const isolationHead = "| N | healthy half, no fault | other half, no fault | healthy half, other Vault blackholed | fault/none | the blackholed half |\n" +
	"|---|---|---|---|---|---|\n"

var isolationRow string

// isolation is what one run of BenchmarkIsolation measured, from the first create on.
type isolation struct {
	// healthy and faulty are the times until all of each half were CredentialsReady (faulty: zero
	// when blackholed).
	healthy, faulty time.Duration
	// reported is when every blackholed cluster had said why it has no credential (zero: not all
	// did within blackholeWatch); reasons counts their CredentialsReady reasons ("": none yet).
	reported time.Duration
	reasons  map[string]int
	// attempts is how many connections the operator opened to the blackholed Vault.
	attempts int
}

// BenchmarkIsolation creates N RedisClusters at once, half through the VaultConnection "scale"
// (the ground's Vault) and half through "faulty" (a proxy in front of the same Vault), on two fresh
// grounds: with the proxy healthy, and blackholed (connections accepted, never answered) from
// before the clusters exist. It reports the time until all of the healthy half are
// CredentialsReady in both runs and their ratio (target ≈ 1: a sick Vault does not slow the
// clusters of another), and what the blackholed half shows.
func BenchmarkIsolation(b *testing.B) {
	n := isolationSize / 2 * 2
	var none, hole isolation
	b.Run("fault=none", func(b *testing.B) {
		for range b.N {
			none = isolate(b, n, false)
		}
		b.ReportMetric(none.healthy.Seconds(), "s-healthy-half-CredentialsReady")
		b.ReportMetric(none.faulty.Seconds(), "s-other-half-CredentialsReady")
		fmt.Printf("isolation: N=%d, no fault: the healthy half all CredentialsReady in %.1f s, the other half in %.1f s\n",
			n, none.healthy.Seconds(), none.faulty.Seconds())
	})
	b.Run("fault=blackhole", func(b *testing.B) {
		for range b.N {
			hole = isolate(b, n, true)
		}
		b.ReportMetric(hole.healthy.Seconds(), "s-healthy-half-CredentialsReady")
		b.ReportMetric(float64(hole.reasons[v1beta1.ReasonVaultUnavailable]), "blackholed-VaultUnavailable")
		b.ReportMetric(float64(hole.attempts), "blackholed-connections")
		fmt.Printf("isolation: N=%d, other Vault blackholed: the healthy half all CredentialsReady in %.1f s; the blackholed half: %s (%s); %d connections to the blackholed Vault\n",
			n, hole.healthy.Seconds(), reasonList(hole.reasons), reportedIn(hole.reported), hole.attempts)
		if none.healthy == 0 {
			return
		}
		ratio := hole.healthy.Seconds() / none.healthy.Seconds()
		b.ReportMetric(ratio, "healthy-fault/none")
		fmt.Printf("isolation: N=%d, the healthy half with the other Vault blackholed / without: %.2f (target ≈ 1)\n", n, ratio)
		isolationRow = fmt.Sprintf("| %d | %.1f s | %.1f s | %.1f s | %.2f | %s, %s |", n, none.healthy.Seconds(), none.faulty.Seconds(),
			hole.healthy.Seconds(), ratio, reasonList(hole.reasons), reportedIn(hole.reported))
		for _, l := range strings.Split(isolationTable(), "\n") {
			fmt.Println("isolation: " + l)
		}
		writeSection(b, "isolation-table", isolationTable())
	})
}

// isolationTable is the docs' isolation table: its head and the last run's row.
func isolationTable() string { return isolationHead + isolationRow }

// isolate is one run on a fresh ground: n clusters, the half through faultyConnection created
// first, so that they are ahead of the healthy half in the operator's queue.
func isolate(b *testing.B, n int, blackhole bool) isolation {
	b.Helper()
	b.StopTimer()
	name := "isolation-none"
	if blackhole {
		name = "isolation-blackhole"
	}
	r := startRun(b, name, runOptions{})
	defer r.end()
	p, err := testground.StartProxy(strings.TrimPrefix(r.fw.Ground.Vault.Addr, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Stop()
	r.connection(b, faultyConnection, p.URL())
	r.fw.WaitConnectionReady(b, faultyConnection, 2*time.Minute)
	if blackhole {
		p.Blackhole()
	}
	accepted := p.Accepted()

	ready := watchReady(b, r)
	half := n / 2
	b.StartTimer()
	start := time.Now()
	createAll(b, r.c, r.ns, faultyPrefix, half, faultyConnection)
	createAll(b, r.c, r.ns, healthyPrefix, half, r.ns)
	var res isolation
	var last map[string]tally
	framework.Eventually(b, 15*time.Minute, func() string {
		last = ready.tallies()
		if res.healthy == 0 && last[healthyPrefix].ready == half {
			res.healthy = time.Since(start)
		}
		if res.faulty == 0 && last[faultyPrefix].ready == half {
			res.faulty = time.Since(start)
		}
		if res.healthy == 0 || (!blackhole && res.faulty == 0) {
			return fmt.Sprintf("CredentialsReady: %d of the healthy half, %d of the other, of %d each", last[healthyPrefix].ready, last[faultyPrefix].ready, half)
		}
		return ""
	})
	b.StopTimer()
	if !blackhole {
		return res
	}
	res.reported, res.reasons = watchBlackholed(b, ready, start, last[faultyPrefix])
	res.attempts = p.Accepted() - accepted
	return res
}

// watchBlackholed waits, until blackholeWatch after start, for every cluster of the blackholed half
// to say why it has no credential, from their tally last; it returns when all had (zero: not all
// did) and their reasons.
func watchBlackholed(b *testing.B, ready *seenWatch, start time.Time, last tally) (time.Duration, map[string]int) {
	b.Helper()
	for last.reasons[""] > 0 && time.Since(start) < blackholeWatch {
		time.Sleep(time.Second)
		last = ready.tallies()[faultyPrefix]
	}
	if last.ready > 0 {
		b.Fatalf("%d clusters became CredentialsReady through the blackholed Vault", last.ready)
	}
	if last.reasons[""] > 0 {
		return 0, last.reasons
	}
	return time.Since(start), last.reasons
}

// reasonList is "VaultUnavailable ×20, no condition yet ×3", the most common first.
func reasonList(reasons map[string]int) string {
	keys := slices.SortedFunc(maps.Keys(reasons), func(a, b string) int {
		return cmp.Or(reasons[b]-reasons[a], strings.Compare(a, b))
	})
	var parts []string
	for _, k := range keys {
		label := k
		if label == "" {
			label = "no condition yet"
		}
		parts = append(parts, fmt.Sprintf("%s ×%d", label, reasons[k]))
	}
	if len(parts) == 0 {
		return "no clusters"
	}
	return strings.Join(parts, ", ")
}

// reportedIn says when every blackholed cluster had reported a reason.
func reportedIn(d time.Duration) string {
	if d == 0 {
		return fmt.Sprintf("not all reported within %s", blackholeWatch)
	}
	return fmt.Sprintf("all reported within %.1f s", d.Seconds())
}
