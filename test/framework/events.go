package framework

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Events lists the events in ns about the object of kind ("" for any kind) named name.
func (f *Framework) Events(t testing.TB, ns, kind, name string) []eventsv1.Event {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := f.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name && (kind == "" || e.Regarding.Kind == kind) {
			out = append(out, e)
		}
	}
	return out
}

// ClusterEvents lists the events about a RedisCluster (not those about its objects of the same
// name, such as its client Service).
func (f *Framework) ClusterEvents(t testing.TB, ns, name string) []eventsv1.Event {
	t.Helper()
	return f.Events(t, ns, "RedisCluster", name)
}

// WaitClusterEvents lists the events about a RedisCluster once every one of reasons is among them,
// or after timeout, whichever comes first: an event is written after the status change it
// announces, so a test that has seen the status may look before the event is there.
func (f *Framework) WaitClusterEvents(t testing.TB, ns, name string, timeout time.Duration, reasons ...string) []eventsv1.Event {
	t.Helper()
	for end := time.Now().Add(timeout); ; time.Sleep(200 * time.Millisecond) {
		events := f.ClusterEvents(t, ns, name)
		got := Reasons(events)
		if !slices.ContainsFunc(reasons, func(r string) bool { return !slices.Contains(got, r) }) || time.Now().After(end) {
			return events
		}
	}
}

// Reasons lists the events' reasons, once per occurrence: the event recorder folds an event
// repeated on the same version of an object into a series, sent as one Event with series.count 2
// (later repeats of a series reach the API server only minutes later).
func Reasons(events []eventsv1.Event) []string {
	var out []string
	for _, e := range events {
		n := 1
		if e.Series != nil {
			n = int(e.Series.Count)
		}
		for range n {
			out = append(out, e.Reason)
		}
	}
	return out
}

// Notes lists the events as "Reason: note".
func Notes(events []eventsv1.Event) []string {
	out := make([]string, 0, len(events))
	for _, e := range events {
		out = append(out, e.Reason+": "+e.Note)
	}
	return out
}

// Warnings keeps the Warning events.
func Warnings(events []eventsv1.Event) []eventsv1.Event {
	var out []eventsv1.Event
	for _, e := range events {
		if e.Type == corev1.EventTypeWarning {
			out = append(out, e)
		}
	}
	return out
}

// Naming keeps the events whose notes name any of words (a credential version, a user, a lease).
func Naming(events []eventsv1.Event, words ...string) []eventsv1.Event {
	var out []eventsv1.Event
	for _, e := range events {
		if slices.ContainsFunc(words, func(w string) bool { return strings.Contains(e.Note, w) }) {
			out = append(out, e)
		}
	}
	return out
}

// NewReasons lists the reasons in after beyond those already in before (each occurrence counted).
func NewReasons(before, after []string) []string {
	left := slices.Clone(before)
	var out []string
	for _, r := range after {
		if i := slices.Index(left, r); i >= 0 {
			left = slices.Delete(left, i, i+1)
			continue
		}
		out = append(out, r)
	}
	return out
}

// HasEvent says whether an event of reason (any, when empty) about a RedisCluster turns up within
// 10 s: the recorder sends events asynchronously, after the status write that carries their change.
func (f *Framework) HasEvent(t testing.TB, ns, name, reason string) bool {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		reasons := Reasons(f.ClusterEvents(t, ns, name))
		if (reason == "" && len(reasons) > 0) || (reason != "" && slices.Contains(reasons, reason)) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
