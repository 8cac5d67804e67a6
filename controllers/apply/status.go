package apply

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PatchStatus writes the status once, as a merge patch with optimistic locking (a stale cache
// must never overwrite the lease ledger), and only when it changed.
func PatchStatus(ctx context.Context, c client.Client, before, after client.Object, statusOf func(client.Object) any) error {
	if equality.Semantic.DeepEqual(statusOf(before), statusOf(after)) {
		return nil
	}
	if err := c.Status().Patch(ctx, after, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patching status: %w", err)
	}
	return nil
}
