package apiversions

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/conversion"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/apis/v1beta1"
	keyrollconversion "github.com/keyroll/keyroll/controllers/conversion"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// alphaClient writes and reads RedisClusters and VaultConnections at v1alpha1, as the previous
// release's manifests and manager do: the framework builds and reads v1beta1 objects, which this
// client converts (with keyroll's own conversion) on the way to the API server and back. Every
// other object passes through.
type alphaClient struct{ client.Client }

// alphaObject is a v1alpha1 object of keyroll's.
type alphaObject interface {
	client.Object
	conversion.Convertible
}

// alphaOf is the v1alpha1 object for obj, when obj is one of keyroll's.
func alphaOf(obj client.Object) (alphaObject, bool) {
	switch obj.(type) {
	case *v1beta1.RedisCluster:
		return &v1alpha1.RedisCluster{}, true
	case *v1beta1.VaultConnection:
		return &v1alpha1.VaultConnection{}, true
	}
	return nil, false
}

func (c alphaClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	a, ok := alphaOf(obj)
	if !ok {
		return c.Client.Create(ctx, obj, opts...)
	}
	if err := a.ConvertFrom(obj.(conversion.Hub)); err != nil {
		return err
	}
	if err := c.Client.Create(ctx, a, opts...); err != nil {
		return err
	}
	return a.ConvertTo(obj.(conversion.Hub))
}

func (c alphaClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	a, ok := alphaOf(obj)
	if !ok {
		return c.Client.Get(ctx, key, obj, opts...)
	}
	if err := c.Client.Get(ctx, key, a, opts...); err != nil {
		return err
	}
	return a.ConvertTo(obj.(conversion.Hub))
}

// Patch sends the patch as the caller made it (from v1beta1 objects) to the v1alpha1 resource:
// right for the metadata patches the framework makes, which both versions read alike.
func (c alphaClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	a, ok := alphaOf(obj)
	if !ok {
		return c.Client.Patch(ctx, obj, patch, opts...)
	}
	data, err := patch.Data(obj)
	if err != nil {
		return err
	}
	a.SetNamespace(obj.GetNamespace())
	a.SetName(obj.GetName())
	if err := c.Client.Patch(ctx, a, client.RawPatch(patch.Type(), data), opts...); err != nil {
		return err
	}
	return a.ConvertTo(obj.(conversion.Hub))
}

// TestV1alpha1ObjectsSurviveTheUpgrade (real node): the previous release installed with its own
// manifests (kubectl apply -k deploy/default: CRDs that serve v1alpha1 alone) holds two
// RedisClusters, one of each credential source, with consumers in pods, and a VaultConnection, all
// written as v1alpha1, and rotates both clusters; then this release's deploy/default is applied
// over it. The objects read as v1beta1 with the values they had as v1alpha1 (the ledger, the
// credential, the nodes); across the upgrade and three minutes after it no Redis container or
// consumer pod restarts, no consumer command fails, no lease is issued or revoked (Vault's audit
// log); the manager rewrites every object at v1beta1 and sets both CRDs' storedVersions to
// [v1beta1]; the new manager renews the leases (they last 2 minutes); and a rotation then works
// end to end.
func TestV1alpha1ObjectsSurviveTheUpgrade(t *testing.T) {
	ctx := context.Background()
	prev := fw.Previous(t)
	imageCtx, cancelImage := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelImage()
	if err := fw.Ground.Node.LoadManagerImage(imageCtx); err != nil {
		t.Fatal(err)
	}
	fw.StopOperator()
	real := fw.Client
	t.Cleanup(func() {
		fw.Client = real
		fw.UndeployManager(t)
	})
	installCRDs(t, filepath.Join(prev, "deploy", "crd"), true)
	for _, name := range keyrollconversion.CRDs {
		if got := storedVersions(t, name); !slices.Equal(got, []string{"v1alpha1"}) {
			t.Fatalf("%s storedVersions %v under %s, want [v1alpha1]", name, got, framework.PreviousRelease)
		}
	}
	fw.MustKubectl(t, nil, "apply", "-k", fw.ManagerOverlay(t, prev, framework.PreviousImage, true))
	fw.WaitManagerReady(t, ctx, framework.PreviousImage, 2)
	fw.Client = alphaClient{real}
	fw.UpgradeScenario(t, "kustomize", "node", auditLog, func() {
		fw.Client = real
		fw.MustKubectl(t, nil, "apply", "-k", fw.ManagerOverlay(t, testground.RepoRoot(), testground.ManagerImage, true))
		fw.WaitManagerReady(t, ctx, testground.ManagerImage, 2)
		framework.Eventually(t, 2*time.Minute, func() string {
			for _, name := range keyrollconversion.CRDs {
				if got := storedVersions(t, name); !slices.Equal(got, []string{"v1beta1"}) {
					return name + " storedVersions " + strings.Join(got, ",")
				}
			}
			return ""
		})
	}, func(sc *framework.UpgradeScene, upgraded time.Time) {
		// The role's leases last 2 minutes: the new manager renewed each in the quiet time.
		for _, rc := range sc.Clusters() {
			cur := fw.Get(t, rc)
			c := cur.Status.Credential
			t.Logf("%s: lease %s last renewed %v (upgraded at %s)", rc.Name, c.Lease.LeaseID, c.Lease.LastRenewal, upgraded.UTC().Format(time.RFC3339))
			if cur.Spec.Credentials.Source == v1beta1.SourceVaultLease && (c.Lease.LastRenewal == nil || c.Lease.LastRenewal.Time.Before(upgraded)) {
				t.Errorf("%s: the lease was not renewed after the upgrade (last renewal %v)", rc.Name, c.Lease.LastRenewal)
			}
		}
	})
}
