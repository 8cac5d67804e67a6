package framework

import (
	"sync"
	"testing"
)

// Parallel runs do for 0..n-1, workers at a time (creating hundreds of objects, say), and fails
// tb with every error it returned.
func Parallel(tb testing.TB, n, workers int, do func(int) error) {
	tb.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := do(i); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Error(err)
	}
	if tb.Failed() {
		tb.FailNow()
	}
}
