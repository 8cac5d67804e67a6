package redisnode

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// tarpit accepts connections on loopback and never answers, as a Redis that hangs does; it closes
// them when the test ends.
func tarpit(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestBudgetBoundsEveryExchangeOfAReconcile: with a node that accepts and never answers, the
// exchanges made with one reconcile's context end by its budget, however many there are and
// however long each one's own Timeout; once the budget is spent, each fails at once, as a
// timeout (Unreachable). Without a budget the Timeout of each exchange alone applies.
func TestBudgetBoundsEveryExchangeOfAReconcile(t *testing.T) {
	addr := tarpit(t)
	const budget = 1500 * time.Millisecond
	ctx := budgetUntil(context.Background(), time.Now().Add(budget))
	start := time.Now()
	for i := range 4 { // four nodes' worth of exchanges: 4 × Timeout without the budget
		n := New(addr, "keyroll-admin", "x", nil)
		_, err := n.ACLList(ctx)
		n.Close()
		if err == nil || !Unreachable(err) {
			t.Fatalf("exchange %d with a node that never answers: %v, want a timeout", i, err)
		}
	}
	if took := time.Since(start); took > budget+time.Second {
		t.Errorf("four exchanges took %s, want them ended by the budget of %s", took, budget)
	}
	n := New(addr, "keyroll-admin", "x", nil)
	defer n.Close()
	begun := time.Now()
	if _, err := n.ACLList(ctx); err == nil || time.Since(begun) > 100*time.Millisecond {
		t.Errorf("an exchange after the budget is spent: %v after %s, want an error at once", err, time.Since(begun))
	}
	begun = time.Now()
	if _, err := n.ACLList(context.Background()); err == nil || time.Since(begun) < Timeout-time.Second {
		t.Errorf("without a budget: %v after %s, want the exchange's own Timeout (%s)", err, time.Since(begun), Timeout)
	}
}
