package api

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	krender "github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/test/framework"
)

// etcdRequestLimit is etcd's default --max-request-bytes (the ground's etcd keeps it): an object
// whose write is larger is refused, and so is every later write of it, status included.
const etcdRequestLimit = 3 << 19 // 1.5 MiB

// The largest status a RedisCluster can reach is accepted by the API server and fits in one etcd
// request with room. It is built by walking the status schema the API server enforces: every
// array at its maxItems, every string at its maxLength (matching its pattern, the longest of its
// enum, a date-time), every number at its largest. A string the schema leaves unbounded is as long
// as what keyroll writes there can be (unboundedStrings): a new field without a bound fails the
// test until it has one or is named there.
func TestTheLargestStatusFits(t *testing.T) {
	ctx := context.Background()
	f := &filler{unbounded: unboundedStrings(t), used: map[string]bool{}}
	status := f.fill(statusSchema(t), "status", false, nil).(map[string]any)
	for _, p := range f.problems {
		t.Error(p)
	}
	for path := range f.unbounded {
		if !f.used[path] {
			t.Errorf("unboundedStrings names %s, which the status schema no longer leaves unbounded", path)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Logf("the largest status: %s", fieldSizes(status))
	obj := parse(t, validRedisCluster, fw.Namespace(t, "largest-status"))
	obj.SetName("largest")
	if err := fw.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	obj.Object["status"] = status
	if err := manager(t).Status().Update(ctx, obj); err != nil {
		t.Fatalf("the API server refused the largest status: %.300v", err)
	}
	back := &unstructured.Unstructured{}
	back.SetGroupVersionKind(obj.GroupVersionKind())
	if err := fw.Client.Get(ctx, client.ObjectKeyFromObject(obj), back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Object["status"], status) {
		t.Error("the status read back is not the status written")
	}
	if err := fw.Client.Get(ctx, client.ObjectKeyFromObject(obj), &v1beta1.RedisCluster{}); err != nil {
		t.Errorf("keyroll's types do not read the largest status: %v", err)
	}
	// An object too large for etcd is written again without its managedFields: accepted, but only
	// just, and with nothing left to say who owns which field.
	if len(back.GetManagedFields()) == 0 {
		t.Error("the API server dropped managedFields to store the largest status: it was over etcd's limit")
	}
	stored, err := json.Marshal(back.Object)
	if err != nil {
		t.Fatal(err)
	}
	managed, _ := json.Marshal(back.GetManagedFields())
	room := etcdRequestLimit - len(stored)
	t.Logf("the object is %d bytes as stored (managedFields %d): %d bytes (%.1f%%) under etcd's %d",
		len(stored), len(managed), room, 100*float64(room)/etcdRequestLimit, etcdRequestLimit)
	// The rest of the object (spec, metadata and their managedFields) is the owner's and needs
	// room of its own: the test asks for a tenth of the limit.
	if room < etcdRequestLimit/10 {
		t.Errorf("the largest RedisCluster leaves %d bytes under etcd's limit of %d, want a tenth of it", room, etcdRequestLimit)
	}
}

// manager writes as keyroll's manager, the one writer of status that deploy/default's admission
// policy admits (another test of this package installs it); in system:masters, so that RBAC,
// which this test does not install, lets it.
func manager(t *testing.T) client.Client {
	return fw.ClientAs(t, "system:serviceaccount:"+framework.ManagerNS+":"+framework.OperatorSA, "system:masters", "system:authenticated")
}

// fieldSizes lists the fields of status by their size as JSON, the largest first.
func fieldSizes(status map[string]any) string {
	type field struct {
		name string
		size int
	}
	var fields []field
	total := 0
	for name, v := range status {
		b, _ := json.Marshal(v)
		fields = append(fields, field{name, len(b)})
		total += len(b)
	}
	slices.SortFunc(fields, func(a, b field) int { return b.size - a.size })
	parts := []string{fmt.Sprintf("%d bytes of JSON", total)}
	for _, f := range fields[:min(len(fields), 6)] {
		parts = append(parts, fmt.Sprintf("%s %d", f.name, f.size))
	}
	return strings.Join(parts, ", ")
}

// statusSchema is the v1beta1 status schema of RedisCluster as the API server holds it.
func statusSchema(t *testing.T) apiextensionsv1.JSONSchemaProps {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Name: "redisclusters.keyroll.dev"}, crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == v1beta1.GroupVersion.Version {
			return v.Schema.OpenAPIV3Schema.Properties["status"]
		}
	}
	t.Fatal("the CRD has no v1beta1")
	return apiextensionsv1.JSONSchemaProps{}
}

// unboundedStrings are the status strings the schema does not bound, by path, each at the most
// that keyroll writes there, as tied to the code or the API server that bounds it.
func unboundedStrings(t *testing.T) map[string]string {
	t.Helper()
	const username = 256 // render.ValidUsername: a longer user from Vault is refused before status
	if !krender.ValidUsername(strings.Repeat("a", username)) || krender.ValidUsername(strings.Repeat("a", username+1)) {
		t.Fatalf("keyroll's bound on a Redis username is no longer %d", username)
	}
	of := func(n int) string { return strings.Repeat("a", n) }
	version := of(len(krender.CredentialVersion("user", "password")))
	duration := time.Duration(math.MaxInt64).String() // a metav1.Duration, which keyroll reads back
	return map[string]string{
		"status.credential.username":                            of(username),
		"status.credential.supersededUsers[]":                   of(username),
		"status.leases[].username":                              of(username),
		"status.retiringUsers[]":                                of(username),
		"status.credential.version":                             version,
		"status.leases[].version":                               version,
		"status.rollout.targetVersion":                          version,
		"status.nodes[].usersVersion":                           of(len(krender.Users{}.Version())),
		"status.nodes[].podUID":                                 of(36), // a UID
		"status.rollout.podInFlight":                            of(63), // a pod's name, as status.primary
		"status.credential.lease.duration":                      duration,
		"status.credential.externalSecret.leaseEndedEarlyAfter": duration,
	}
}

// filler makes the largest value a schema admits.
type filler struct {
	// unbounded are the values of strings the schema leaves unbounded, by path (unboundedStrings).
	unbounded map[string]string
	used      map[string]bool
	// n counts the strings that must differ from their neighbours (a list's keys, a set's items):
	// each ends with its number.
	n        int
	problems []string
}

// fill makes the largest value of s. unique asks for a value no other has (a set's item); keys
// are the properties of s that must be (a list map's keys).
func (f *filler) fill(s apiextensionsv1.JSONSchemaProps, path string, unique bool, keys []string) any {
	switch s.Type {
	case "object":
		if s.AdditionalProperties != nil || s.XPreserveUnknownFields != nil {
			f.problem("%s: a map or unknown fields, which the walk cannot bound", path)
		}
		m := map[string]any{}
		for name, p := range s.Properties {
			m[name] = f.fill(p, path+"."+name, slices.Contains(keys, name), nil)
		}
		return m
	case "array":
		if s.MaxItems == nil {
			f.problem("%s has no maxItems", path)
			return []any{}
		}
		set := s.XListType != nil && *s.XListType == "set"
		items := make([]any, *s.MaxItems)
		for i := range items {
			items[i] = f.fill(*s.Items.Schema, path+"[]", set, s.XListMapKeys)
		}
		return items
	case "string":
		return f.str(s, path, unique)
	case "integer":
		switch {
		case s.Maximum != nil:
			return int64(*s.Maximum)
		case s.Format == "int32":
			return int64(math.MaxInt32)
		default:
			return int64(math.MaxInt64)
		}
	case "boolean":
		return true
	}
	f.problem("%s: type %q", path, s.Type)
	return nil
}

// str is the longest string s admits: the longest of its enum, a date-time, or its maxLength of
// characters that match its pattern.
func (f *filler) str(s apiextensionsv1.JSONSchemaProps, path string, unique bool) string {
	switch {
	case len(s.Enum) > 0 && !unique:
		var longest string
		for _, e := range s.Enum {
			var v string
			if err := json.Unmarshal(e.Raw, &v); err != nil {
				f.problem("%s: enum value %s: %v", path, e.Raw, err)
			}
			if len(v) > len(longest) {
				longest = v
			}
		}
		return longest
	case s.Format == "date-time" && !unique:
		return "2026-03-04T05:06:07Z" // as metav1.Time writes it, to the second
	case s.Format != "" || len(s.Enum) > 0:
		f.problem("%s: format %q or enum %d values, which the walk does not fill", path, s.Format, len(s.Enum))
		return ""
	case s.MaxLength == nil:
		v, ok := f.unbounded[path]
		f.used[path] = ok
		if !ok {
			f.problem("%s has no maxLength: bound it, or say in unboundedStrings what keyroll writes there", path)
		}
		return f.tagged(v, unique)
	}
	n := int(*s.MaxLength)
	for _, c := range []string{"a", "A", "0"} {
		if v := f.tagged(strings.Repeat(c, n), unique); s.Pattern == "" || regexp.MustCompile(s.Pattern).MatchString(v) {
			return v
		}
	}
	f.problem("%s: no string of %d characters found for its pattern %s", path, n, s.Pattern)
	return ""
}

// tagged ends v with the next number, in letters, when it must be unique.
func (f *filler) tagged(v string, unique bool) string {
	if !unique {
		return v
	}
	f.n++
	tag := strings.ToLower(base26(f.n))
	return v[:max(0, len(v)-len(tag))] + tag
}

// base26 writes n in the letters A to Z.
func base26(n int) string {
	var b []byte
	for ; n > 0; n /= 26 {
		b = append(b, byte('A'+n%26))
	}
	slices.Reverse(b)
	return string(b)
}

func (f *filler) problem(format string, args ...any) {
	f.problems = append(f.problems, fmt.Sprintf(format, args...))
}
