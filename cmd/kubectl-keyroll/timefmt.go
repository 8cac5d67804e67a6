package main

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
)

// when writes a time as RFC 3339 with how far it is from now: "2026-12-01T03:00:00Z (in 14h)".
func (o *options) when(t *metav1.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339) + " (" + o.relative(t.Time) + ")"
}

// ago writes how long ago a time was: "5m ago".
func (o *options) ago(t metav1.Time) string {
	if t.IsZero() {
		return "-"
	}
	return o.relative(t.Time)
}

func (o *options) agoPtr(t *metav1.Time) string {
	if t == nil {
		return "-"
	}
	return o.ago(*t)
}

func (o *options) relative(t time.Time) string {
	d := t.Sub(o.now())
	switch {
	case d > 0:
		return "in " + duration.HumanDuration(d)
	case d > -time.Second:
		return "now"
	}
	return duration.HumanDuration(-d) + " ago"
}
