package conversion

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/apis/v1beta1"
)

// floodReview streams a ConversionReview of at least size bytes without holding it, and returns
// its exact length: one v1alpha1 RedisCluster with as many short annotations as it takes, the
// shape that costs a decoder the most heap per byte.
func floodReview(size int64) (io.Reader, int64) {
	head := `{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"flood",` +
		`"desiredAPIVersion":"keyroll.dev/v1beta1","objects":[{"apiVersion":"keyroll.dev/v1alpha1",` +
		`"kind":"RedisCluster","metadata":{"name":"flood","namespace":"default","annotations":{`
	tail := `"z":""}}}]}}`
	n := (size - int64(len(head)+len(tail)) + entryLen - 1) / entryLen
	body := io.MultiReader(strings.NewReader(head), &annotations{n: n}, strings.NewReader(tail))
	return body, int64(len(head)+len(tail)) + n*entryLen
}

const entryLen = int64(len(`"a0000000":"",`))

// annotations reads as n distinct annotations "a<7 hex digits>":"", without allocating.
type annotations struct {
	n, i    int64
	entry   [entryLen]byte
	pending []byte
}

func (a *annotations) Read(p []byte) (int, error) {
	read := 0
	for read < len(p) {
		if len(a.pending) == 0 {
			if a.i == a.n {
				break
			}
			copy(a.entry[:], `"a0000000":"",`)
			for j, v := 8, a.i; j >= 2; j, v = j-1, v>>4 {
				a.entry[j] = "0123456789abcdef"[v&15]
			}
			a.pending, a.i = a.entry[:], a.i+1
		}
		c := copy(p[read:], a.pending)
		a.pending, read = a.pending[c:], read+c
	}
	if read == 0 {
		return 0, io.EOF
	}
	return read, nil
}

func conversionScheme(t *testing.T) *kruntime.Scheme {
	t.Helper()
	s := kruntime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1beta1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// smallReview asks for a v1alpha1 RedisCluster, with a lease in its status, in v1beta1.
func smallReview(t *testing.T) []byte {
	t.Helper()
	rc := &v1alpha1.RedisCluster{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "RedisCluster"},
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "default"},
		Status:     v1alpha1.RedisClusterStatus{Credential: &v1alpha1.CredentialStatus{LeaseID: "database/creds/orders/abc"}},
	}
	raw, err := json.Marshal(rc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(&apiextensionsv1.ConversionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "ConversionReview"},
		Request: &apiextensionsv1.ConversionRequest{UID: types.UID("small"), DesiredAPIVersion: v1beta1.GroupVersion.String(),
			Objects: []kruntime.RawExtension{{Raw: raw}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// expectConverted reads the answer to smallReview: the RedisCluster in v1beta1, its lease where
// v1beta1 keeps it.
func expectConverted(t *testing.T, body io.Reader) {
	t.Helper()
	var review apiextensionsv1.ConversionReview
	if err := json.NewDecoder(body).Decode(&review); err != nil {
		t.Fatal(err)
	}
	res := review.Response
	if res == nil || res.UID != "small" || res.Result.Status != metav1.StatusSuccess || len(res.ConvertedObjects) != 1 {
		t.Fatalf("answer: %+v", res)
	}
	var out v1beta1.RedisCluster
	if err := json.Unmarshal(res.ConvertedObjects[0].Raw, &out); err != nil {
		t.Fatal(err)
	}
	c := out.Status.Credential
	if out.APIVersion != v1beta1.GroupVersion.String() || out.Name != "orders" || c == nil || c.Lease.LeaseID != "database/creds/orders/abc" {
		t.Fatalf("converted: %s", res.ConvertedObjects[0].Raw)
	}
}
