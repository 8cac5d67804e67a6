package rediscluster

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/vault"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

// writeLog lists the writes the reconciler made, as "Kind/name" (a status write as
// "RedisCluster/name/status").
type writeLog struct {
	mu     sync.Mutex
	writes []string
}

func (w *writeLog) add(o client.Object, suffix string) {
	w.note(reflect.TypeOf(o).Elem().Name(), o.GetName(), suffix)
}

func (w *writeLog) note(kind, name, suffix string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, kind+"/"+name+suffix)
}

// list is the writes so far, and forgets them.
func (w *writeLog) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.writes
	w.writes = nil
	return out
}

// logWrites makes the reconciler's client note every write it makes.
func (h *harness) logWrites() *writeLog {
	w := &writeLog{}
	h.r = h.r.WithClient(interceptor.NewClient(h.k8s.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			w.add(o, "")
			return c.Create(ctx, o, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
			w.add(o, "")
			return c.Update(ctx, o, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
			w.add(o, "")
			return c.Patch(ctx, o, p, opts...)
		},
		// keyroll's server-side applies (apply.ServerSide) send the object's unstructured form.
		Apply: func(ctx context.Context, c client.WithWatch, o runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			if u, ok := o.(interface {
				GetKind() string
				GetName() string
			}); ok {
				w.note(u.GetKind(), u.GetName(), "")
			}
			return c.Apply(ctx, o, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
			w.add(o, "")
			return c.Delete(ctx, o, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, s string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			w.add(o, "/"+s)
			return c.SubResource(s).Patch(ctx, o, p, opts...)
		},
	}))
	return w
}

// A new cluster's first reconcile ends once its first credential is issued, recorded and kept:
// its Redis objects wait for its next reconcile, behind the other clusters in the queue, so that
// a thousand clusters created at once each hold a lease after a few writes instead of after the
// objects of all those ahead of it. The admin password reaches the state Secret in the same write
// as the credential, and before any aclfile.
func TestNewClusterHoldsItsCredentialBeforeItsObjects(t *testing.T) {
	h := newHarness(t, cluster())
	w := h.logWrites()

	res := h.reconcile(t)
	if res.RequeueAfter != objectsAfterCredential {
		t.Errorf("first reconcile asks to be called again after %s; want %s, for its objects", res.RequeueAfter, objectsAfterCredential)
	}
	if n := h.vault.Calls(vaulttest.OpIssue); n != 1 {
		t.Fatalf("%d issues, want 1", n)
	}
	rc := h.get(t)
	if c := condition(rc, v1beta1.ConditionCredentialsReady); c == nil || c.Status != "True" {
		t.Errorf("CredentialsReady %+v after the first reconcile", c)
	}
	want := []string{"RedisCluster/orders", "RedisCluster/orders/status", "Secret/orders-keyroll"}
	if got := w.list(); !slices.Equal(got, want) {
		t.Errorf("first reconcile wrote %v; want %v (finalizer, ledger, state Secret with admin password and credential)", got, want)
	}
	state := &corev1.Secret{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: render.StateSecretName(rc)}, state); err != nil {
		t.Fatal(err)
	}
	if len(state.Data[render.AdminPasswordKey]) == 0 || render.CredentialVersion(string(state.Data[render.StateUsernameKey]), string(state.Data[render.StatePasswordKey])) != rc.Status.Credential.Version {
		t.Error("the state Secret lacks the admin password or the issued credential")
	}
	// (The harness starts with the StatefulSet and its pods, as the kubelet reports them; that
	// the first reconcile writes no StatefulSet shows in its writes above.)
	for _, o := range []client.Object{&corev1.ConfigMap{}, &corev1.Service{}} {
		if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, o); !apierrors.IsNotFound(err) {
			t.Errorf("%T exists after the first reconcile (%v); it waits for the next", o, err)
		}
	}

	h.reconcile(t)
	written := w.list()
	acl := slices.Index(written, "Secret/orders-acl")
	sts := slices.Index(written, "StatefulSet/orders")
	if acl < 0 || sts < acl {
		t.Errorf("second reconcile wrote %v; want the ACL Secret, then the StatefulSet", written)
	}
	if slices.Contains(written, "Secret/orders-keyroll") {
		t.Errorf("second reconcile wrote the state Secret again: %v", written)
	}
	if n := h.vault.Calls(vaulttest.OpIssue); n != 1 {
		t.Errorf("%d issues after the second reconcile, want still 1", n)
	}
	if h.settle(t); h.vault.Calls(vaulttest.OpIssue) != 1 {
		t.Errorf("%d issues once settled", h.vault.Calls(vaulttest.OpIssue))
	}
}

// When Vault gives no credential, the objects are written in the first reconcile all the same, the
// admin password before the aclfile that holds its hash.
func TestNewClusterWithoutCredentialStillGetsItsObjects(t *testing.T) {
	h := newHarness(t, cluster())
	h.vault.SetFailure(vaulttest.OpIssue, vaulttest.Err(vaulttest.OpIssue, vault.ClassUnavailable))
	w := h.logWrites()

	_, _ = h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "orders"}})
	written := w.list()
	state, acl := slices.Index(written, "Secret/orders-keyroll"), slices.Index(written, "Secret/orders-acl")
	if state < 0 || acl < state || !slices.Contains(written, "StatefulSet/orders") {
		t.Errorf("wrote %v; want the state Secret (admin password), then the ACL Secret, and the StatefulSet", written)
	}
}
