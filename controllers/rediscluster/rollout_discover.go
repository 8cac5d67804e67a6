package rediscluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
)

// The consumers a rollout restarts are the listed ones (spec.rollout.consumers), those found
// referencing the credentials Secret (rollout.discoverConsumers, looked up at each credential
// rollout's start) and those found logged in with a superseded user (rollout.unlistedClients
// Restart). status.consumers records the last two, with the workloads that reference the Secret
// and are never restarted (CronJobs, Jobs), so that the owner sees the list keyroll used.

// maxConsumersInUse is how many workloads status.consumers holds.
const maxConsumersInUse = 128

// consumerRefs are the workloads a rollout restarts, in order: the listed ones, then the
// discovered and logged-in ones of status.consumers.
func consumerRefs(rc *v1beta1.RedisCluster) []v1beta1.ConsumerReference {
	refs := slices.Clone(rc.Spec.Rollout.Consumers)
	for _, c := range rc.Status.Consumers {
		ref := v1beta1.ConsumerReference{Kind: c.Kind, Name: c.Name}
		if c.Restarted && c.Via != v1beta1.ConsumerListed && !slices.Contains(refs, ref) {
			refs = append(refs, ref)
		}
	}
	return refs
}

// discoverConsumers records in status.consumers what the rollout starting now uses: the listed
// consumers, those it finds referencing the credentials Secret with rollout.discoverConsumers,
// and those kept from an earlier find of clients logged in as a superseded user.
func (r *Engine) discoverConsumers(ctx context.Context, s *step) error {
	rc := s.rc
	var out []v1beta1.ConsumerInUse
	for _, ref := range rc.Spec.Rollout.Consumers {
		out = append(out, v1beta1.ConsumerInUse{Kind: ref.Kind, Name: ref.Name, Via: v1beta1.ConsumerListed, Restarted: true})
	}
	listed := func(kind, name string) bool {
		return slices.ContainsFunc(out, func(c v1beta1.ConsumerInUse) bool { return c.Kind == kind && c.Name == name })
	}
	if rc.Spec.Rollout.DiscoverConsumers {
		found, stopped, err := r.referencing(ctx, rc)
		if err != nil {
			return err
		}
		if stopped {
			s.conds.Event(true, v1beta1.EventConsumerDiscoveryBounded, "Rollout",
				"rollout.discoverConsumers stopped after examining %d workloads of namespace %s, keyroll's bound: those past it were not looked at, and one that references Secret %s is restarted only if spec.rollout.consumers lists it",
				maxDiscoveryExamined, rc.Namespace, render.CredentialsSecretName(rc))
		}
		var restarted, reported []string
		for _, c := range found {
			if listed(c.Kind, c.Name) {
				continue
			}
			out = append(out, c)
			if c.Restarted {
				restarted = append(restarted, c.Kind+"/"+c.Name)
			} else {
				reported = append(reported, c.Kind+"/"+c.Name)
			}
		}
		if len(restarted)+len(reported) > 0 {
			msg := "Found referencing Secret " + render.CredentialsSecretName(rc) + " (rollout.discoverConsumers): "
			if len(restarted) > 0 {
				msg += "restarted as consumers: " + strings.Join(restarted, ", ")
			}
			if len(reported) > 0 {
				if len(restarted) > 0 {
					msg += "; "
				}
				msg += "not restarted by keyroll (they get the new credential when they next start a pod; one running now keeps the old one): " + strings.Join(reported, ", ")
			}
			s.conds.Event(false, v1beta1.EventConsumersDiscovered, "Rollout", "%s", msg)
		}
	}
	for _, c := range rc.Status.Consumers {
		if c.Via == v1beta1.ConsumerLoggedIn && !listed(c.Kind, c.Name) {
			out = append(out, c)
		}
	}
	if len(out) > maxConsumersInUse {
		out = out[:maxConsumersInUse]
	}
	rc.Status.Consumers = out
	return nil
}

// maxDiscoveryExamined is how many workloads rollout.discoverConsumers examines at most, all
// kinds together: a namespace may hold hundreds of thousands of Jobs, each read in full from the
// API server (past the cache) at every rotation. Discovery stops there and says so; the
// workloads it did not reach can be listed in spec.rollout.consumers.
const maxDiscoveryExamined = 5000

// discoveryPage is how many objects one list request of discovery asks for.
const discoveryPage = 500

// discovery lists workloads of one namespace past the cache, a page at a time, and counts them
// against maxDiscoveryExamined.
type discovery struct {
	reader   client.Reader
	ns       string
	examined int
	// stopped says discovery reached maxDiscoveryExamined with workloads left to examine.
	stopped bool
}

// errDiscoveryBound ends the walk of a page at maxDiscoveryExamined.
var errDiscoveryBound = errors.New("discovery bound reached")

// each calls visit on every object of newList's kind until the bound, reading a page at a time.
func (d *discovery) each(ctx context.Context, newList func() client.ObjectList, what string, visit func(runtime.Object)) error {
	token := ""
	for !d.stopped {
		list := newList()
		if err := d.reader.List(ctx, list, client.InNamespace(d.ns), client.Limit(discoveryPage), client.Continue(token)); err != nil {
			return fmt.Errorf("listing %s for rollout.discoverConsumers: %w", what, err)
		}
		err := apimeta.EachListItem(list, func(o runtime.Object) error {
			if d.examined == maxDiscoveryExamined {
				d.stopped = true
				return errDiscoveryBound
			}
			d.examined++
			visit(o)
			return nil
		})
		if err != nil && !errors.Is(err, errDiscoveryBound) {
			return err
		}
		if token = list.GetContinue(); token == "" {
			return nil
		}
	}
	return nil
}

// referencing lists the workloads in rc's namespace whose pod template references its
// credentials Secret: Deployments, StatefulSets and DaemonSets (restarted), CronJobs and the Jobs
// no CronJob runs (reported). Workloads a RedisCluster controls (keyroll's own) are left out.
// They are read past the cache, which holds no consumer, in pages, up to maxDiscoveryExamined
// (stopped says the bound cut discovery short); Jobs, which pile up, come last.
func (r *Engine) referencing(ctx context.Context, rc *v1beta1.RedisCluster) (found []v1beta1.ConsumerInUse, stopped bool, err error) {
	secret := render.CredentialsSecretName(rc)
	add := func(kind string, meta metav1.Object, spec *corev1.PodSpec, restarted bool) {
		if owner := metav1.GetControllerOf(meta); owner != nil && (owner.Kind == "RedisCluster" || owner.Kind == "CronJob") {
			return
		}
		if refs := secretReferences(spec, secret); len(refs) > 0 {
			found = append(found, v1beta1.ConsumerInUse{Kind: kind, Name: meta.GetName(), Via: v1beta1.ConsumerDiscovered, References: refs, Restarted: restarted})
		}
	}
	visit := func(o runtime.Object) {
		switch w := o.(type) {
		case *appsv1.Deployment:
			add("Deployment", w, &w.Spec.Template.Spec, true)
		case *appsv1.StatefulSet:
			add("StatefulSet", w, &w.Spec.Template.Spec, true)
		case *appsv1.DaemonSet:
			add("DaemonSet", w, &w.Spec.Template.Spec, true)
		case *batchv1.CronJob:
			add("CronJob", w, &w.Spec.JobTemplate.Spec.Template.Spec, false)
		case *batchv1.Job:
			if w.Status.CompletionTime == nil {
				add("Job", w, &w.Spec.Template.Spec, false)
			}
		}
	}
	d := &discovery{reader: r.APIReader, ns: rc.Namespace}
	for _, k := range []struct {
		what string
		list func() client.ObjectList
	}{
		{"Deployments", func() client.ObjectList { return &appsv1.DeploymentList{} }},
		{"StatefulSets", func() client.ObjectList { return &appsv1.StatefulSetList{} }},
		{"DaemonSets", func() client.ObjectList { return &appsv1.DaemonSetList{} }},
		{"CronJobs", func() client.ObjectList { return &batchv1.CronJobList{} }},
		{"Jobs", func() client.ObjectList { return &batchv1.JobList{} }},
	} {
		if err := d.each(ctx, k.list, k.what, visit); err != nil {
			return nil, false, err
		}
	}
	return found, d.stopped, nil
}

// secretReferences says where a pod spec uses Secret name: each container's (init containers'
// too) env and envFrom, and its volumes, projected ones included; at most eight.
func secretReferences(spec *corev1.PodSpec, name string) []string {
	var refs []string
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == name {
				refs = append(refs, fmt.Sprintf("env %s of container %s", e.Name, c.Name))
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil && e.SecretRef.Name == name {
				refs = append(refs, "envFrom of container "+c.Name)
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == name {
			refs = append(refs, "volume "+v.Name)
		}
		if v.Projected != nil && slices.ContainsFunc(v.Projected.Sources, func(p corev1.VolumeProjection) bool {
			return p.Secret != nil && p.Secret.Name == name
		}) {
			refs = append(refs, "projected volume "+v.Name)
		}
	}
	if len(refs) > 8 {
		refs = refs[:8]
	}
	for i, r := range refs {
		if len(r) > maxReference { // status.consumers[].references items: an env variable's name has no bound
			refs[i] = r[:maxReference-3] + "..."
		}
	}
	return refs
}

// maxReference is the length of a reference status.consumers holds.
const maxReference = 256

// adoptLoggedIn makes consumers (status.consumers, via LoggedIn) of the Deployments, StatefulSets
// and DaemonSets in the cluster's namespace among the clients still logged in with a superseded
// user (rollout.unlistedClients Restart), so that the next rollout restarts them; it returns
// those it added. A client of another namespace, of another kind of workload, or at an address
// that is no pod's, is never touched.
func adoptLoggedIn(rc *v1beta1.RedisCluster, clients []v1beta1.OldUserClient) []string {
	var added []string
	for _, c := range clients {
		kind, name, ok := strings.Cut(c.Workload, "/")
		if !ok || strings.Contains(name, " ") || !slices.Contains([]string{"Deployment", "StatefulSet", "DaemonSet"}, kind) {
			continue // no pod's, a pod of another namespace ("… in namespace …"), or not a workload keyroll restarts
		}
		if slices.Contains(consumerRefs(rc), v1beta1.ConsumerReference{Kind: kind, Name: name}) || len(rc.Status.Consumers) >= maxConsumersInUse {
			continue
		}
		rc.Status.Consumers = append(rc.Status.Consumers, v1beta1.ConsumerInUse{Kind: kind, Name: name, Via: v1beta1.ConsumerLoggedIn, Restarted: true})
		added = append(added, c.Workload)
	}
	return added
}
