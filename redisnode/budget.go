package redisnode

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// ReconcileBudget is how long one reconcile of a RedisCluster may spend waiting on its Redis
// nodes, all of them together: with Timeout per dial or command, a node that accepts connections
// and never answers costs a few Timeouts, not the reconcile's whole timeout, and the cluster yields
// its worker (its nodes are reported unreachable, and it is looked at again later).
const ReconcileBudget = 15 * time.Second

type budgetKey struct{}

// Budgeted returns ctx with ReconcileBudget from now for the Redis exchanges made with it (dials
// and commands of a Client): past it, each fails at once. ctx's own deadline, and everything else
// done with it (API requests, Vault calls), are not changed.
func Budgeted(ctx context.Context) context.Context {
	return budgetUntil(ctx, time.Now().Add(ReconcileBudget))
}

func budgetUntil(ctx context.Context, end time.Time) context.Context {
	return context.WithValue(ctx, budgetKey{}, end)
}

// bounded is ctx ended by its Redis budget, if it has one; err says that the budget is spent.
func bounded(ctx context.Context) (context.Context, context.CancelFunc, error) {
	end, ok := ctx.Value(budgetKey{}).(time.Time)
	if !ok {
		return ctx, func() {}, nil
	}
	if !time.Now().Before(end) {
		return nil, nil, fmt.Errorf("this reconcile's time for Redis (%s) is spent: %w", ReconcileBudget, context.DeadlineExceeded)
	}
	ctx, cancel := context.WithDeadline(ctx, end)
	return ctx, cancel, nil
}

// budgetHook applies the budget to every dial and command of a client, and MaxReply to every
// reply read on the connections it dials.
type budgetHook struct{}

func (budgetHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel, err := bounded(ctx)
		if err != nil {
			return nil, err
		}
		defer cancel()
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return bound(c, MaxReply), nil
	}
}

func (budgetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ctx, cancel, err := bounded(ctx)
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		defer cancel()
		return next(ctx, cmd)
	}
}

func (budgetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		ctx, cancel, err := bounded(ctx)
		if err != nil {
			return err
		}
		defer cancel()
		return next(ctx, cmds)
	}
}

// newClient is a go-redis client with options, bounded by the budget of each context it is used with.
func newClient(o *redis.Options) *redis.Client {
	c := redis.NewClient(o)
	c.AddHook(budgetHook{})
	return c
}
