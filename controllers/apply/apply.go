package apply

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/managedfields"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/structured-merge-diff/v6/typed"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// FieldOwner is the field manager of keyroll's server-side applies.
const FieldOwner = "keyroll"

// Owned writes desired, an object the RedisCluster owns, by server-side apply as FieldOwner:
// the API server merges the fields keyroll sets and leaves the rest (defaults, other managers'
// fields) alone, and fields someone else changed are taken back. It makes no request when the
// fields keyroll owns in the cached object already hold desired's values, so that a steady state
// writes nothing. An object of that name that the RedisCluster does not control is refused with a
// ConflictError; rd reads past the cache, which holds keyroll's own objects only.
func Owned(ctx context.Context, c client.Client, rd client.Reader, owner *v1beta1.RedisCluster, desired client.Object) error {
	gvk, err := apiutil.GVKForObject(desired, c.Scheme())
	if err != nil {
		return err
	}
	desired.GetObjectKind().SetGroupVersionKind(gvk)
	if err := controllerutil.SetControllerReference(owner, desired, c.Scheme()); err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(desired)
	current, err := c.Scheme().New(gvk)
	if err != nil {
		return err
	}
	cur := current.(client.Object)
	err = c.Get(ctx, key, cur)
	if apierrors.IsNotFound(err) {
		err = rd.Get(ctx, key, cur)
	}
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading %s %s: %w", gvk.Kind, key.Name, err)
	case !OwnedBy(cur, owner):
		return &ConflictError{Kind: gvk.Kind, Name: key.Name}
	default:
		same, diff, err := applied(cur, desired)
		if err != nil || same {
			return err
		}
		log.FromContext(ctx).V(1).Info("Applying an owned object whose fields differ", "kind", gvk.Kind, "object", key.Name, "fields", diff)
	}
	if err := ServerSide(ctx, c, desired, FieldOwner); err != nil {
		return fmt.Errorf("applying %s %s: %w", gvk.Kind, key.Name, err)
	}
	return nil
}

// ServerSide server-side-applies obj, a typed object with its kind set, as owner, taking over
// fields another manager set (ForceOwnership), and reads the API server's answer back into obj.
// controller-runtime applies apply configurations; keyroll builds typed objects, so obj goes as
// the unstructured form of the same JSON, which is what the server receives either way.
func ServerSide(ctx context.Context, c client.Client, obj client.Object, owner string) error {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: m}
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(owner), client.ForceOwnership); err != nil {
		return err
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj)
}

// applied says whether the fields FieldOwner owns in current hold exactly what desired sets; if
// not, diff names the top fields that differ (never their values: they may be secret).
func applied(current, desired client.Object) (same bool, diff []string, err error) {
	have, err := ownedFields(current)
	if err != nil || have == nil {
		return false, []string{"(none owned yet)"}, err
	}
	want, err := asMap(desired)
	if err != nil {
		return false, nil, err
	}
	h, w := comparable(have), comparable(want)
	if reflect.DeepEqual(h, w) {
		return true, nil, nil
	}
	return false, differing("", h, w), nil
}

// differing lists the paths, two levels deep at most, where a and b differ.
func differing(path string, a, b any) []string {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok || strings.Count(path, ".") >= 4 {
		if reflect.DeepEqual(a, b) {
			return nil
		}
		return []string{path}
	}
	var out []string
	for k := range am {
		out = append(out, differing(path+"."+k, am[k], bm[k])...)
	}
	for k := range bm {
		if _, ok := am[k]; !ok {
			out = append(out, path+"."+k)
		}
	}
	return out
}

// ownedFields are the fields of obj that FieldOwner owns, with their values, as JSON would have
// them; nil when it owns none (the object was not written by server-side apply).
func ownedFields(obj client.Object) (map[string]any, error) {
	gvk := obj.GetObjectKind().GroupVersionKind()
	var ac any
	var err error
	switch o := obj.(type) {
	case *corev1.Secret:
		ac, err = corev1ac.ExtractSecret(o, FieldOwner)
	case *corev1.ConfigMap:
		ac, err = corev1ac.ExtractConfigMap(o, FieldOwner)
	case *corev1.Service:
		ac, err = corev1ac.ExtractService(o, FieldOwner)
	case *appsv1.StatefulSet:
		ac, err = appsv1ac.ExtractStatefulSet(o, FieldOwner)
	case *policyv1.PodDisruptionBudget:
		ac, err = policyv1ac.ExtractPodDisruptionBudget(o, FieldOwner)
	case *networkingv1.NetworkPolicy:
		// Its schema, not a deduced one: deduced, a selector's fields come out unlike the
		// object's, and every reconcile would apply it again.
		ac, err = networkingv1ac.ExtractNetworkPolicy(o, FieldOwner)
	default: // a custom resource (ExternalSecret): its schema is not compiled in, so deduce it
		m := map[string]any{}
		err = managedfields.ExtractInto(obj, typed.DeducedParseableType, FieldOwner, &m, "")
		ac = m
	}
	if err != nil {
		return nil, fmt.Errorf("reading the fields %s owns in %s %s: %w", FieldOwner, gvk.Kind, obj.GetName(), err)
	}
	m, err := asMap(ac)
	if err != nil {
		return nil, err
	}
	if md, _ := m["metadata"].(map[string]any); len(m) <= 3 && len(md) <= 2 {
		return nil, nil // apiVersion, kind, name and namespace only: nothing owned
	}
	return m, nil
}

// asMap is v as JSON would have it.
func asMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	return m, json.Unmarshal(b, &m)
}

// comparable keeps what keyroll sets: no status, no server-kept metadata, no empty values, and
// not the name and namespace, which are the object's key (the same on both sides; an extraction
// deduced from managedFields, for a custom resource, has them not).
func comparable(m map[string]any) any {
	delete(m, "status")
	delete(m, "apiVersion")
	delete(m, "kind")
	if md, ok := m["metadata"].(map[string]any); ok {
		for k := range md {
			switch k {
			case "labels", "annotations", "ownerReferences":
			default:
				delete(md, k)
			}
		}
	}
	return prune(m)
}

// prune drops nulls, empty maps and empty lists, at every depth.
func prune(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if p := prune(e); isEmpty(p) {
				delete(t, k)
			} else {
				t[k] = p
			}
		}
		return t
	case []any:
		for i := range t {
			t[i] = prune(t[i])
		}
		return t
	}
	return v
}

func isEmpty(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case map[string]any:
		return len(t) == 0
	case []any:
		return len(t) == 0
	}
	return false
}
