package apply

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
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

// Stale says whether rc, as a reconcile read it from the cache, is older than the version the API
// server has (rd reads past the cache): acting on it could repeat a step that a previous reconcile
// took, such as an issue or a restart. A cluster gone meanwhile is not stale; without rd, nothing is.
func Stale(ctx context.Context, rd client.Reader, rc *v1beta1.RedisCluster) (bool, error) {
	if rd == nil {
		return false, nil
	}
	cur := &v1beta1.RedisCluster{}
	if err := rd.Get(ctx, client.ObjectKeyFromObject(rc), cur); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return cur.ResourceVersion != rc.ResourceVersion, nil
}
