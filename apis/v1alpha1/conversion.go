package v1alpha1

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/conversion"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// Conversion to and from v1beta1, the hub. The two versions hold the same values; only some live
// at other paths, listed in the moves below (v1alpha1's path, then v1beta1's). A conversion
// moves them on the object's JSON and decodes the result strictly, so a field that one version
// has and the other lacks cannot be dropped unnoticed: converting from v1beta1 keeps such spec
// fields in the annotation FieldsAnnotation, and converting back puts them in place again.
//
// Status fields never travel in the annotation. Whoever may update a RedisCluster may write its
// annotations, but not its status: on an update of the main resource the API server puts back
// the status the object had, and converts the result to v1beta1 only afterwards, annotations as
// the writer sent them. A status field carried in the annotation would thus be set by a write
// that may not set status (a forged lease, a credential that is not one). A conversion cannot
// tell that write from a write of the status subresource, so it takes no status from the
// annotation at all, and a v1beta1 status field without a place in v1alpha1 is left out of the
// v1alpha1 object instead: a v1alpha1 reader does not know it, and a v1alpha1 write (of either
// kind) stores the object without it. No such field exists (TestConversionRoundTrip fails when
// one is added, as it would not come back): one must come with a place in v1alpha1's status,
// where the API server keeps main-resource writes from it.

// FieldsAnnotation holds, on a v1alpha1 object converted from v1beta1, the v1beta1 spec fields
// that v1alpha1 has no place for, as a JSON object from JSON pointer to value.
const FieldsAnnotation = "keyroll.dev/v1beta1-fields"

// move is one field at a path in v1alpha1 and at another in v1beta1.
type move struct{ alpha, beta string }

// redisClusterMoves: v1beta1 splits status.credential into what every source reports, lease (the
// credential's Vault lease, whatever the source), vaultLease and externalSecret.
var redisClusterMoves = []move{
	{"/status/credential/leaseID", "/status/credential/lease/leaseID"},
	{"/status/credential/expiresAt", "/status/credential/lease/expiresAt"},
	{"/status/credential/renewable", "/status/credential/lease/renewable"},
	{"/status/credential/leaseDuration", "/status/credential/lease/duration"},
	{"/status/credential/renewalCapped", "/status/credential/lease/renewalCapped"},
	{"/status/credential/lastRenewal", "/status/credential/lease/lastRenewal"},
	{"/status/credential/nextRenewal", "/status/credential/lease/nextRenewal"},
	{"/status/credential/path", "/status/credential/vaultLease/path"},
	{"/status/credential/tokenAccessor", "/status/credential/vaultLease/tokenAccessor"},
	{"/status/credential/tokenEndsAt", "/status/credential/vaultLease/tokenEndsAt"},
	{"/status/credential/refreshRequestedAt", "/status/credential/externalSecret/refreshRequestedAt"},
	{"/status/credential/leasesTracked", "/status/credential/externalSecret/leasesTracked"},
	{"/status/credential/leaseEndedEarlyAfter", "/status/credential/externalSecret/leaseEndedEarlyAfter"},
	{"/status/credential/cutOff", "/status/credential/externalSecret/cutOff"},
}

// vaultConnectionMoves: v1beta1 names the TLS server name spec.tls.serverName.
var vaultConnectionMoves = []move{
	{"/spec/tls/tlsServerName", "/spec/tls/serverName"},
}

// ConvertTo converts this RedisCluster to the hub version, v1beta1.
func (src *RedisCluster) ConvertTo(dst conversion.Hub) error {
	return toHub(src, dst, redisClusterMoves)
}

// ConvertFrom converts a v1beta1 RedisCluster to this version.
func (dst *RedisCluster) ConvertFrom(src conversion.Hub) error {
	return fromHub(src, dst, redisClusterMoves)
}

// ConvertTo converts this VaultConnection to the hub version, v1beta1.
func (src *VaultConnection) ConvertTo(dst conversion.Hub) error {
	return toHub(src, dst, vaultConnectionMoves)
}

// ConvertFrom converts a v1beta1 VaultConnection to this version.
func (dst *VaultConnection) ConvertFrom(src conversion.Hub) error {
	return fromHub(src, dst, vaultConnectionMoves)
}

// toHub moves src's fields to their v1beta1 paths, puts back the fields FieldsAnnotation kept,
// and decodes the result into dst, refusing a field v1beta1 has no place for.
func toHub(src runtime.Object, dst conversion.Hub, moves []move) error {
	obj, err := toMap(src)
	if err != nil {
		return err
	}
	kept, err := takeKeptFields(obj)
	if err != nil {
		return err
	}
	// The kept fields are where fromHub found them missing: at v1alpha1's paths, which v1alpha1's
	// type has no field for. One that it has would override the value v1alpha1's schema validated
	// with one no schema has seen: refused.
	// So is one that v1alpha1 has at another path (a move's), or a part of one.
	for _, p := range sortedKeys(kept) {
		if hasField(reflect.TypeOf(src), strings.Split(strings.TrimPrefix(p, "/"), "/")) || movedHere(moves, p) {
			return fmt.Errorf("metadata.annotations[%s]: %q is a field of %s: set it there", FieldsAnnotation, p, GroupVersion)
		}
		setPath(obj, p, kept[p])
	}
	for _, m := range moves {
		relocate(obj, m.alpha, m.beta)
	}
	setAPIVersion(obj, v1beta1.GroupVersion.String())
	return decodeStrict(obj, dst)
}

// movedHere says whether v1beta1's path p holds, contains or is part of a field that v1alpha1
// has at another path.
func movedHere(moves []move, p string) bool {
	return slices.ContainsFunc(moves, func(m move) bool {
		return p == m.beta || strings.HasPrefix(p, m.beta+"/") || strings.HasPrefix(m.beta, p+"/")
	})
}

// fromHub moves src's fields to their v1alpha1 paths and decodes the result into dst; whatever
// of spec v1alpha1 has no place for goes into FieldsAnnotation, whatever of status is left out
// (see above).
func fromHub(src conversion.Hub, dst runtime.Object, moves []move) error {
	obj, err := toMap(src)
	if err != nil {
		return err
	}
	for _, m := range moves {
		relocate(obj, m.beta, m.alpha)
	}
	setAPIVersion(obj, GroupVersion.String())
	if err := decodeLenient(obj, dst); err != nil {
		return err
	}
	back, err := toMap(dst)
	if err != nil {
		return err
	}
	extra := map[string]any{}
	missing(obj, back, "", extra)
	for p := range extra {
		if p == "/status" || strings.HasPrefix(p, "/status/") {
			delete(extra, p)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	raw, err := json.Marshal(extra)
	if err != nil {
		return err
	}
	acc, ok := dst.(interface {
		GetAnnotations() map[string]string
		SetAnnotations(map[string]string)
	})
	if !ok {
		return fmt.Errorf("converting to %T: no annotations to keep the fields %v in", dst, sortedKeys(extra))
	}
	ann := acc.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[FieldsAnnotation] = string(raw)
	acc.SetAnnotations(ann)
	return nil
}

// setAPIVersion names the version converted to when the object names its kind; an object without
// type information (as a typed client holds it) gets none, and dst keeps what it was given.
func setAPIVersion(obj map[string]any, version string) {
	if _, ok := obj["kind"]; ok {
		obj["apiVersion"] = version
	} else {
		delete(obj, "apiVersion")
	}
}

// takeKeptFields removes FieldsAnnotation from the object's metadata and returns what it held.
func takeKeptFields(obj map[string]any) (map[string]any, error) {
	meta, _ := obj["metadata"].(map[string]any)
	ann, _ := meta["annotations"].(map[string]any)
	raw, ok := ann[FieldsAnnotation].(string)
	if !ok {
		return nil, nil
	}
	delete(ann, FieldsAnnotation)
	if len(ann) == 0 {
		delete(meta, "annotations")
	}
	kept := map[string]any{}
	if err := json.Unmarshal([]byte(raw), &kept); err != nil {
		return nil, fmt.Errorf("metadata.annotations[%s]: not a JSON object of fields: %w", FieldsAnnotation, err)
	}
	for p := range kept {
		if !strings.HasPrefix(p, "/spec/") {
			return nil, fmt.Errorf("metadata.annotations[%s]: %q is not a field of spec: the annotation carries no status, and a write of the object may not set it", FieldsAnnotation, p)
		}
	}
	return kept, nil
}

// hasField says whether values of type t have a field at the JSON path keys (any key of a map).
func hasField(t reflect.Type, keys []string) bool {
	for _, k := range keys {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Map:
			t = t.Elem()
		case reflect.Struct:
			f, ok := jsonField(t, k)
			if !ok {
				return false
			}
			t = f.Type
		default:
			return false
		}
	}
	return true
}

// jsonField is the field of struct type t that JSON names name, looking into inlined structs.
func jsonField(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-":
		case tag == "" && (f.Anonymous || opts == "inline"):
			inner := f.Type
			for inner.Kind() == reflect.Pointer {
				inner = inner.Elem()
			}
			if inner.Kind() == reflect.Struct {
				if sf, ok := jsonField(inner, name); ok {
					return sf, true
				}
			}
		case tag == name, tag == "" && f.Name == name:
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// missing adds to extra, by JSON pointer, every value of want that got has not (maps are
// compared key by key, anything else as a whole).
func missing(want, got map[string]any, at string, extra map[string]any) {
	for k, w := range want {
		p := at + "/" + k
		g, ok := got[k]
		if !ok {
			if p != "/metadata" && !strings.HasPrefix(p, "/metadata/") {
				extra[p] = w
			}
			continue
		}
		wm, wok := w.(map[string]any)
		gm, gok := g.(map[string]any)
		if wok && gok {
			missing(wm, gm, p, extra)
		}
	}
}

// relocate moves the value at from to to, creating to's parents, and removes the parents of from
// that the move leaves empty.
func relocate(obj map[string]any, from, to string) {
	v, ok := takePath(obj, from)
	if ok {
		setPath(obj, to, v)
	}
}

func takePath(obj map[string]any, p string) (any, bool) {
	keys := strings.Split(strings.TrimPrefix(p, "/"), "/")
	parents := []map[string]any{obj}
	cur := obj
	for _, k := range keys[:len(keys)-1] {
		next, ok := cur[k].(map[string]any)
		if !ok {
			return nil, false
		}
		parents = append(parents, next)
		cur = next
	}
	last := keys[len(keys)-1]
	v, ok := cur[last]
	if !ok {
		return nil, false
	}
	delete(cur, last)
	for i := len(parents) - 1; i > 0 && len(parents[i]) == 0; i-- {
		delete(parents[i-1], keys[i-1])
	}
	return v, true
}

func setPath(obj map[string]any, p string, v any) {
	keys := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := obj
	for _, k := range keys[:len(keys)-1] {
		next, ok := cur[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[k] = next
		}
		cur = next
	}
	cur[keys[len(keys)-1]] = v
}

func toMap(obj runtime.Object) (map[string]any, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	// Numbers stay as written: a float64 would round an int64 beyond 2^53.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	m := map[string]any{}
	return m, dec.Decode(&m)
}

func decodeStrict(obj map[string]any, dst runtime.Object) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return fmt.Errorf("converting to %s: %w", v1beta1.GroupVersion, err)
	}
	return nil
}

func decodeLenient(obj map[string]any, dst runtime.Object) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("converting to %s: %w", GroupVersion, err)
	}
	return nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
