package framework

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// Kubectl runs the test ground's kubectl against the ground with args, env added to its
// environment (PATH=... for a plugin, say), and returns what it printed, standard error included.
func (f *Framework) Kubectl(env []string, args ...string) (string, error) {
	bin, err := testground.Binary("kubectl")
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+f.Ground.CP.Kubeconfig), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// MustKubectl is Kubectl that fails the test when kubectl fails.
func (f *Framework) MustKubectl(t testing.TB, env []string, args ...string) string {
	t.Helper()
	out, err := f.Kubectl(env, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// WarningRecorder keeps the warnings the API server sends with its answers (a rest.Config's
// WarningHandler).
type WarningRecorder struct {
	mu   sync.Mutex
	list []string
}

// HandleWarningHeader records one warning.
func (w *WarningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

// All lists the warnings so far.
func (w *WarningRecorder) All() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.list...)
}

// ScrapeMetrics reads the metric families a plain-HTTP metrics endpoint serves.
func ScrapeMetrics(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(resp.Body)
}

// ApplySamples applies deploy/samples (kustomize) with server-side apply as fieldOwner, their Vault
// addresses (the VaultConnection's and the generator's) set to vaultAddr, and returns the objects
// it applied.
func ApplySamples(ctx context.Context, c client.Client, vaultAddr, fieldOwner string) ([]*unstructured.Unstructured, error) {
	objs, err := render.Kustomize("samples")
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		switch {
		case o.GetKind() == "VaultConnection":
			_ = unstructured.SetNestedField(o.Object, vaultAddr, "spec", "address")
		case strings.HasPrefix(o.GetAPIVersion(), "generators.external-secrets.io"):
			_ = unstructured.SetNestedField(o.Object, vaultAddr, "spec", "provider", "server")
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
			return nil, fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return objs, nil
}

// WaitConnectionReady waits until the VaultConnection named name is Ready and returns it.
func (f *Framework) WaitConnectionReady(t testing.TB, name string, timeout time.Duration) *v1beta1.VaultConnection {
	t.Helper()
	vc := &v1beta1.VaultConnection{}
	Eventually(t, timeout, func() string {
		if err := f.Client.Get(context.Background(), client.ObjectKey{Name: name}, vc); err != nil {
			return err.Error()
		}
		if c := meta.FindStatusCondition(vc.Status.Conditions, v1beta1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Sprintf("VaultConnection %s: Ready is %+v", name, c)
		}
		return ""
	})
	return vc
}

// WarningClient is a client of the ground that records the warnings the API server sends with its
// answers (Pod Security admission warns about a workload whose pods it would refuse, say).
func (f *Framework) WarningClient(t testing.TB) (client.Client, *WarningRecorder) {
	t.Helper()
	warnings := &WarningRecorder{}
	cfg := rest.CopyConfig(f.Ground.CP.Config)
	cfg.WarningHandler = warnings
	c, err := client.New(cfg, client.Options{Scheme: f.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c, warnings
}

// ClientAs is a client of the ground that makes every request as user, in groups (impersonated by
// the ground's administrator): what RBAC and admission let that user do, and no more.
func (f *Framework) ClientAs(t testing.TB, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(f.Ground.CP.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := client.New(cfg, client.Options{Scheme: f.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
