package apply

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// ConflictError says that an object keyroll would write exists and is not controlled by the
// RedisCluster: keyroll never overwrites it.
type ConflictError struct {
	Kind, Name string
}

func (e *ConflictError) Error() string {
	hint := "delete or rename it"
	if e.Kind == "Secret" {
		hint += ", or set spec.credentials.secretName"
	}
	return fmt.Sprintf("%s %s exists and is not owned by this RedisCluster; keyroll does not overwrite it (%s)", e.Kind, e.Name, hint)
}

// SecretsFree makes sure that each of the named Secrets of rc's namespace is absent or rc's to
// write: controlled by rc, or one that also accepts (nil: none). The cache (cached) holds only
// Secrets with keyroll's label, so one it lacks is read past it (uncached); the names are read at
// once. A Secret that is not free is a *ConflictError.
func SecretsFree(ctx context.Context, cached, uncached client.Reader, rc *v1beta1.RedisCluster, names []string, also func(*corev1.Secret) bool) error {
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			sec := &corev1.Secret{}
			key := client.ObjectKey{Namespace: rc.Namespace, Name: name}
			err := cached.Get(ctx, key, sec)
			if apierrors.IsNotFound(err) {
				err = uncached.Get(ctx, key, sec)
			}
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				errs[i] = fmt.Errorf("reading Secret %s: %w", name, err)
			case !OwnedBy(sec, rc) && (also == nil || !also(sec)):
				errs[i] = &ConflictError{Kind: "Secret", Name: name}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// OwnedBy says whether rc is obj's controller.
func OwnedBy(obj client.Object, rc *v1beta1.RedisCluster) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == rc.UID
}

// KeepOwnManagedFields is the cache's transform: of an object's managedFields it keeps only the
// entries of keyroll's server-side applies. keyroll reads no other (Owned compares the
// fields it applied itself), and the others (kube-controller-manager's and the kubelet's status
// writes, the creator's fields of every RedisCluster and consumer workload) would be a good part
// of the cache's memory.
func KeepOwnManagedFields(in any) (any, error) {
	obj, ok := in.(metav1.Object)
	if !ok {
		return in, nil
	}
	var kept []metav1.ManagedFieldsEntry
	for _, e := range obj.GetManagedFields() {
		if e.Manager == FieldOwner && e.Operation == metav1.ManagedFieldsOperationApply {
			kept = append(kept, e)
		}
	}
	obj.SetManagedFields(kept)
	return in, nil
}
