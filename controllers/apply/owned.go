package apply

import (
	"context"
	"fmt"
	"maps"

	esv1 "github.com/external-secrets/external-secrets/apis/externalsecrets/v1"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// ConflictError says that an object keyroll would write exists and is not controlled by the
// RedisCluster: keyroll never overwrites it.
type ConflictError struct {
	Kind, Name string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s %s exists and is not owned by this RedisCluster; keyroll does not overwrite it (delete or rename it, or set spec.credentials.secretName)", e.Kind, e.Name)
}

// Ensure creates desired, or updates the existing object when the fields keyroll sets differ
// (same reports whether they are equal; update copies them over). It makes no write when nothing
// differs, and refuses to touch an object that the RedisCluster does not control. rd reads past
// the cache, which holds keyroll's own objects only: it tells a foreign object from a lagging cache.
func Ensure[T client.Object](ctx context.Context, r client.Client, rd client.Reader, rc *v1alpha1.RedisCluster,
	desired, existing T, same func(desired, existing T) bool, update func(desired, existing T)) error {
	key := client.ObjectKeyFromObject(desired)
	kind := fmt.Sprintf("%T", desired)[1:]
	if gvk, err := apiutil.GVKForObject(desired, r.Scheme()); err == nil {
		kind = gvk.Kind
	}
	err := r.Get(ctx, key, existing)
	if apierrors.IsNotFound(err) {
		if err := controllerutil.SetControllerReference(rc, desired, r.Scheme()); err != nil {
			return err
		}
		err := r.Create(ctx, desired)
		if apierrors.IsAlreadyExists(err) {
			// The cache holds keyroll's own objects only, or lags: ask the API server whose it is.
			if err := rd.Get(ctx, key, existing); err != nil {
				return fmt.Errorf("reading %s %s: %w", kind, key.Name, err)
			}
			if !OwnedBy(existing, rc) {
				return &ConflictError{Kind: kind, Name: key.Name}
			}
			return fmt.Errorf("creating %s %s: %w", kind, key.Name, err) // ours, the cache lagged: again soon
		}
		if err != nil {
			return fmt.Errorf("creating %s %s: %w", kind, key.Name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", kind, key.Name, err)
	}
	if !OwnedBy(existing, rc) {
		return &ConflictError{Kind: kind, Name: key.Name}
	}
	if same(desired, existing) && labelsContain(existing.GetLabels(), desired.GetLabels()) &&
		labelsContain(existing.GetAnnotations(), desired.GetAnnotations()) {
		return nil
	}
	update(desired, existing)
	existing.SetLabels(merge(existing.GetLabels(), desired.GetLabels()))
	existing.SetAnnotations(merge(existing.GetAnnotations(), desired.GetAnnotations()))
	if err := r.Update(ctx, existing); err != nil {
		return fmt.Errorf("updating %s %s: %w", kind, key.Name, err)
	}
	return nil
}

// OwnedBy says whether rc is obj's controller.
func OwnedBy(obj client.Object, rc *v1alpha1.RedisCluster) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == rc.UID
}

func labelsContain(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func merge(into, from map[string]string) map[string]string {
	out := maps.Clone(into)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, from)
	return out
}

// Comparisons and updates per kind. DeepDerivative ignores the fields the API server defaults.

func SameService(d, e *corev1.Service) bool {
	return equality.Semantic.DeepDerivative(d.Spec.Selector, e.Spec.Selector) &&
		equality.Semantic.DeepDerivative(d.Spec.Ports, e.Spec.Ports) &&
		d.Spec.PublishNotReadyAddresses == e.Spec.PublishNotReadyAddresses
}

func UpdateService(d, e *corev1.Service) {
	e.Spec.Selector, e.Spec.Ports, e.Spec.PublishNotReadyAddresses = d.Spec.Selector, d.Spec.Ports, d.Spec.PublishNotReadyAddresses
}

func SameConfigMap(d, e *corev1.ConfigMap) bool { return equality.Semantic.DeepEqual(d.Data, e.Data) }
func UpdateConfigMap(d, e *corev1.ConfigMap)    { e.Data = d.Data }

func SameSecret(d, e *corev1.Secret) bool { return equality.Semantic.DeepEqual(d.Data, e.Data) }
func UpdateSecret(d, e *corev1.Secret)    { e.Data = d.Data }

func SameStatefulSet(d, e *appsv1.StatefulSet) bool {
	return *d.Spec.Replicas == *e.Spec.Replicas &&
		equality.Semantic.DeepDerivative(d.Spec.Template, e.Spec.Template) &&
		equality.Semantic.DeepDerivative(d.Spec.UpdateStrategy, e.Spec.UpdateStrategy)
}

func UpdateStatefulSet(d, e *appsv1.StatefulSet) {
	e.Spec.Replicas, e.Spec.Template, e.Spec.UpdateStrategy = d.Spec.Replicas, d.Spec.Template, d.Spec.UpdateStrategy
}

func SameExternalSecret(d, e *esv1.ExternalSecret) bool {
	return equality.Semantic.DeepDerivative(d.Spec, e.Spec)
}

func UpdateExternalSecret(d, e *esv1.ExternalSecret) { e.Spec = d.Spec }
