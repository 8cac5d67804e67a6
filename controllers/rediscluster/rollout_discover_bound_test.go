package rediscluster

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/status"
)

// listCall is one list request the paging reader answered.
type listCall struct {
	kind     string
	limit    int64
	returned int
}

// pagingReader answers list requests as the API server does, which the fake client does not:
// at most limit objects, in name order, and a continue token for the rest. It records each call.
func pagingReader(t *testing.T, objs []client.Object, calls *[]listCall) client.Reader {
	t.Helper()
	return fake.NewClientBuilder().WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			o := (&client.ListOptions{}).ApplyOptions(opts)
			if err := c.List(ctx, list, client.InNamespace(o.Namespace)); err != nil {
				return err
			}
			items, err := apimeta.ExtractList(list)
			if err != nil {
				return err
			}
			slices.SortFunc(items, func(a, b runtime.Object) int {
				return strings.Compare(a.(client.Object).GetName(), b.(client.Object).GetName())
			})
			from, _ := strconv.Atoi(o.Continue)
			to := len(items)
			if o.Limit > 0 {
				to = min(to, from+int(o.Limit))
			}
			if err := apimeta.SetList(list, items[from:to]); err != nil {
				return err
			}
			list.SetContinue("")
			if to < len(items) {
				list.SetContinue(strconv.Itoa(to))
			}
			*calls = append(*calls, listCall{kind: fmt.Sprintf("%T", list), limit: o.Limit, returned: to - from})
			return nil
		},
	}).Build()
}

// In a namespace with more workloads than discovery examines, discovery reads them a page at a
// time and stops at the bound: a Deployment past it is not found (and no Job is read), one
// before it is, and a Warning event says that discovery stopped there.
func TestConsumerDiscoveryStopsAtItsBound(t *testing.T) {
	rc := cluster(func(rc *v1beta1.RedisCluster) { rc.Spec.Rollout.DiscoverConsumers = true })
	var objs []client.Object
	for i := range maxDiscoveryExamined + discoveryPage + 100 {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: fmt.Sprintf("app-%05d", i)}}
		if i == 1 || i == maxDiscoveryExamined+1 {
			d.Spec.Template.Spec = podUsing("orders-credentials", "env")
		}
		objs = append(objs, d)
	}
	objs = append(objs, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "report"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: podUsing("orders-credentials", "env")}}})
	var calls []listCall
	rec := events.NewFakeRecorder(10)
	e := &Engine{APIReader: pagingReader(t, objs, &calls)}
	s := &step{rc: rc, conds: status.Setter{Obj: rc, Conditions: &rc.Status.Conditions, Recorder: rec}}
	if err := e.discoverConsumers(context.Background(), s); err != nil {
		t.Fatal(err)
	}

	var found []string
	for _, c := range rc.Status.Consumers {
		found = append(found, c.Kind+"/"+c.Name)
	}
	if !slices.Equal(found, []string{"Deployment/app-00001"}) {
		t.Errorf("found %v, want only Deployment/app-00001 (app-%05d and the Job are past the bound)", found, maxDiscoveryExamined+1)
	}
	read := 0
	for _, c := range calls {
		if c.limit <= 0 || c.limit > discoveryPage {
			t.Errorf("a list of %s asked for %d objects, want pages of at most %d", c.kind, c.limit, discoveryPage)
		}
		if c.kind != "*v1.DeploymentList" {
			t.Errorf("a list of %s after the bound was reached", c.kind)
		}
		read += c.returned
	}
	if read > maxDiscoveryExamined+discoveryPage {
		t.Errorf("%d objects read in %d lists, want at most %d", read, len(calls), maxDiscoveryExamined+discoveryPage)
	}
	var bounded []string
	for len(rec.Events) > 0 {
		if e := <-rec.Events; strings.Contains(e, v1beta1.EventConsumerDiscoveryBounded) {
			bounded = append(bounded, e)
		}
	}
	if len(bounded) != 1 || !strings.HasPrefix(bounded[0], "Warning") || !strings.Contains(bounded[0], fmt.Sprintf("after examining %d workloads", maxDiscoveryExamined)) {
		t.Errorf("events %q: want one Warning ConsumerDiscoveryBounded that gives the bound", bounded)
	}
}
