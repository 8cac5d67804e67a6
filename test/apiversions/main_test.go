// Package apiversions tests keyroll's two API versions against a real kube-apiserver, with the
// manager's conversion webhook served in the test process: objects the previous release stored as
// v1alpha1 read as v1beta1 with every value and are rewritten at v1beta1 (storedVersions ends as
// [v1beta1]); with the webhook down, list and watch of the storage version go on and a v1alpha1
// request fails with a clear message; the webhook's certificate and CA are replaced before they
// expire without a failed conversion. The package has a control plane of its own: it replaces
// keyroll's CRDs.
package apiversions

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/controllers/conversion"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var fw *framework.Framework

// auditLog is the package's Vault audit log (framework.EnableAudit).
var auditLog string

func TestMain(m *testing.M) {
	fw = framework.New(framework.Config{
		Name: "apiversions",
		// A ground of its own: the package replaces keyroll's CRDs, which packages sharing a
		// ground use. The real node, Vault, Redis and External Secrets Operator run the previous
		// release's clusters across the upgrade.
		OwnGround: true,
		Ground:    testground.Options{Node: true, Redis: true, Vault: true, ExternalSecrets: true},
		// Leases of 2 minutes: the upgrade's quiet time sees each renewed.
		Roles: []testground.RedisRole{{Name: "node", DefaultTTL: 2 * time.Minute, MaxTTL: time.Hour}},
		// Vault's audit log (what the upgrade issues and revokes) and ESO's Vault policy.
		Setup: func(ctx context.Context, f *framework.Framework) error {
			var err error
			if auditLog, err = f.EnableAudit(ctx); err != nil {
				return err
			}
			if err := f.WriteExternalSecretsPolicy(ctx, f.Name("eso")); err != nil {
				return err
			}
			// The manager's image (TestV1alpha1ObjectsSurviveTheUpgrade runs it) is built before
			// any test's clock starts.
			return f.Ground.Node.LoadManagerImage(ctx)
		},
	})
	// The operators in this process have the deployed manager's identity: its service account,
	// which the operator's Kubernetes auth role in Vault binds, in the manifests' namespace.
	fw.OperatorNS = framework.ManagerNS
	os.Exit(fw.Run(m))
}

// installCRDs replaces keyroll's CRDs with those in dir (deleting the old ones, and every object
// with them, when fresh is set) and waits until they serve.
func installCRDs(t *testing.T, dir string, fresh bool) {
	t.Helper()
	ctx := context.Background()
	for _, name := range conversion.CRDs {
		raw, err := os.ReadFile(filepath.Join(dir, "keyroll.dev_"+strings.TrimSuffix(name, ".keyroll.dev")+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var want apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		var cur apiextensionsv1.CustomResourceDefinition
		err = fw.Client.Get(ctx, client.ObjectKey{Name: name}, &cur)
		switch {
		case err == nil && fresh:
			releaseObjects(t, &cur)
			if err := fw.Client.Delete(ctx, &cur); err != nil {
				t.Fatal(err)
			}
			framework.Eventually(t, time.Minute, func() string {
				if err := fw.Client.Get(ctx, client.ObjectKey{Name: name}, &cur); !apierrors.IsNotFound(err) {
					return "CRD " + name + " not gone yet"
				}
				return ""
			})
			if err := fw.Client.Create(ctx, &want); err != nil {
				t.Fatal(err)
			}
		case err == nil:
			cur.Spec = want.Spec
			if err := fw.Client.Update(ctx, &cur); err != nil {
				t.Fatal(err)
			}
		case apierrors.IsNotFound(err):
			if err := fw.Client.Create(ctx, &want); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal(err)
		}
		framework.Eventually(t, time.Minute, func() string {
			if err := fw.Client.Get(ctx, client.ObjectKey{Name: name}, &cur); err != nil {
				return err.Error()
			}
			for _, c := range cur.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return ""
				}
			}
			return "CRD " + name + " not established"
		})
	}
	// The API server's discovery and storage follow a CRD change within a moment.
	time.Sleep(2 * time.Second)
}

// releaseObjects removes the finalizers of the CRD's objects before the CRD is deleted with them:
// a test that failed can leave objects behind with no manager to run their finalizers.
func releaseObjects(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	ctx := context.Background()
	// Each served version in turn: a list fails at a version that some object would need the
	// conversion webhook for, when it is down.
	for _, v := range crd.Spec.Versions {
		res := dynamicClient(t).Resource(schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural})
		list, err := res.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Logf("listing %s at %s: %v", crd.Name, v.Name, err)
			continue
		}
		for _, o := range list.Items {
			if len(o.GetFinalizers()) == 0 {
				continue
			}
			patch := []byte(`{"metadata":{"finalizers":null}}`)
			if _, err := res.Namespace(o.GetNamespace()).Patch(ctx, o.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("removing the finalizers of %s %s/%s: %v", crd.Spec.Names.Kind, o.GetNamespace(), o.GetName(), err)
			}
		}
	}
}

// currentCRDs is the directory of the CRDs this release ships.
func currentCRDs() string { return filepath.Join(testground.RepoRoot(), "deploy", "crd") }

// previousCRDs are the CRDs and samples of the last release that served v1alpha1 alone
// (deploy/crd and deploy/samples at 0282c70).
func previousCRDs() string { return filepath.Join("testdata", "v1alpha1") }

// storedVersions is the CRD's status.storedVersions.
func storedVersions(t *testing.T, name string) []string {
	t.Helper()
	var crd apiextensionsv1.CustomResourceDefinition
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Name: name}, &crd); err != nil {
		t.Fatal(err)
	}
	return crd.Status.StoredVersions
}

// onCurrentCRDs is the start of a test on this release's CRDs: they are installed, and the test's
// namespace (base) and the operator's exist.
func onCurrentCRDs(t *testing.T, base string) (context.Context, dynamic.Interface, string) {
	t.Helper()
	ns := fw.Name(base)
	ensureNamespace(t, ns)
	ensureNamespace(t, fw.OperatorNS)
	installCRDs(t, currentCRDs(), false)
	return context.Background(), dynamicClient(t), ns
}

func ensureNamespace(t *testing.T, name string) {
	t.Helper()
	err := fw.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
