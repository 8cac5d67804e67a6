package framework

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// PodWatch follows the pods of a namespace that a label selector selects, from its start until the
// test ends, and records what rollouts are judged by: each pod's termination (the moment its
// deletion began, or its deletion when no terminating state was seen) with the other pods' state
// then, every sighting of a pod that was not Ready, and the fewest Ready pods of each group.
type PodWatch struct {
	mu          sync.Mutex
	pods        map[string]*corev1.Pod // the latest of each name
	ended       map[types.UID]bool
	terms       []Termination
	notReady    map[string][]time.Time
	groupLabel  string
	fewestReady map[string]int
}

// Termination is a pod whose deletion began, and the other pods as they were at that moment.
type Termination struct {
	Pod string
	At  time.Time
	// Labels and Annotations are the pod's as it began to terminate.
	Labels, Annotations map[string]string
	// NotReady are the other pods that were not Ready (terminating ones included), and
	// Terminating those of them whose deletion had begun.
	NotReady, Terminating []string
}

// LiveNotReady are the other pods that were not Ready and not terminating either.
func (t Termination) LiveNotReady() []string {
	return slices.DeleteFunc(slices.Clone(t.NotReady), func(n string) bool { return slices.Contains(t.Terminating, n) })
}

// WatchPods starts a PodWatch on the pods of namespace ns that selector selects.
func (f *Framework) WatchPods(t testing.TB, ns, selector string) *PodWatch {
	t.Helper()
	w, err := f.Clientset.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	pw := &PodWatch{pods: map[string]*corev1.Pod{}, ended: map[types.UID]bool{}, notReady: map[string][]time.Time{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Error {
				pw.saw(p, ev.Type == watch.Deleted)
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return pw
}

func (pw *PodWatch) saw(p *corev1.Pod, gone bool) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	now := time.Now()
	if (p.DeletionTimestamp != nil || gone) && !pw.ended[p.UID] {
		pw.ended[p.UID] = true
		term := Termination{Pod: p.Name, At: now, Labels: p.Labels, Annotations: p.Annotations}
		for name, o := range pw.pods {
			if name == p.Name {
				continue
			}
			if !PodReady(o) {
				term.NotReady = append(term.NotReady, name)
			}
			if o.DeletionTimestamp != nil {
				term.Terminating = append(term.Terminating, name)
			}
		}
		slices.Sort(term.NotReady)
		slices.Sort(term.Terminating)
		pw.terms = append(pw.terms, term)
	}
	if !gone && !PodReady(p) {
		pw.notReady[p.Name] = append(pw.notReady[p.Name], now)
	}
	if gone {
		if cur := pw.pods[p.Name]; cur != nil && cur.UID == p.UID {
			delete(pw.pods, p.Name)
		}
	} else {
		pw.pods[p.Name] = p.DeepCopy()
	}
	if pw.fewestReady != nil {
		ready := pw.readyByGroup()
		for group := range pw.fewestReady {
			pw.fewestReady[group] = min(pw.fewestReady[group], ready[group])
		}
	}
}

// readyByGroup counts the Ready pods that are not terminating by the value of the group label.
func (pw *PodWatch) readyByGroup() map[string]int {
	out := map[string]int{}
	for _, o := range pw.pods {
		if o.DeletionTimestamp == nil && PodReady(o) {
			out[o.Labels[pw.groupLabel]]++
		}
	}
	return out
}

// CountReady starts counting, from now on, the fewest Ready pods (not terminating) of each value
// of label (FewestReady).
func (pw *PodWatch) CountReady(label string) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	pw.groupLabel = label
	pw.fewestReady = pw.readyByGroup()
}

// FewestReady is, for each value of CountReady's label, the fewest Ready pods seen since.
func (pw *PodWatch) FewestReady() map[string]int {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	out := map[string]int{}
	for k, v := range pw.fewestReady {
		out[k] = v
	}
	return out
}

// Terminations are the pods whose deletion began, in order.
func (pw *PodWatch) Terminations() []Termination {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return slices.Clone(pw.terms)
}

// Pods are the pods as last seen, by name, terminating ones included.
func (pw *PodWatch) Pods() map[string]*corev1.Pod {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	out := map[string]*corev1.Pod{}
	for k, v := range pw.pods {
		out[k] = v.DeepCopy()
	}
	return out
}

// NotReadySeen is, for each pod, when it was seen not Ready.
func (pw *PodWatch) NotReadySeen() map[string][]time.Time {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	out := map[string][]time.Time{}
	for k, v := range pw.notReady {
		out[k] = slices.Clone(v)
	}
	return out
}
