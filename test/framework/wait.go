package framework

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// Eventually polls check every 100 ms until it returns "" or timeout passes; then the test fails
// with the last message, which explains why.
func Eventually(t testing.TB, timeout time.Duration, check func() string) {
	t.Helper()
	if msg := Poll(timeout, check); msg != "" {
		t.Fatalf("after %s: %s", timeout, msg)
	}
}

// Poll is Eventually for a goroutine other than the test's: it returns the last message ("" once
// check passed).
func Poll(timeout time.Duration, check func() string) string {
	deadline := time.Now().Add(timeout)
	for {
		msg := check()
		if msg == "" || time.Now().After(deadline) {
			return msg
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Condition is a RedisCluster's condition of a type (nil without one).
func Condition(rc *v1beta1.RedisCluster, typ string) *metav1.Condition {
	return meta.FindStatusCondition(rc.Status.Conditions, typ)
}

// WaitCondition waits until the RedisCluster has a condition of the type with status (and reason,
// unless empty), and returns the cluster as read then.
func (f *Framework) WaitCondition(t testing.TB, rc *v1beta1.RedisCluster, typ string, status metav1.ConditionStatus, reason string, timeout time.Duration) *v1beta1.RedisCluster {
	t.Helper()
	var cur *v1beta1.RedisCluster
	Eventually(t, timeout, func() string {
		cur = f.Get(t, rc)
		c := Condition(cur, typ)
		if c == nil || c.Status != status || (reason != "" && c.Reason != reason) {
			return fmt.Sprintf("%s/%s: condition %s is %+v, want %s/%s", rc.Namespace, rc.Name, typ, c, status, reason)
		}
		return ""
	})
	return cur
}

// WaitReady waits until the RedisCluster is Ready: a live credential that every Redis node
// accepts (UsersApplied), and every Redis pod Ready. A failure lists the namespace's pods.
func (f *Framework) WaitReady(t testing.TB, rc *v1beta1.RedisCluster, timeout time.Duration) *v1beta1.RedisCluster {
	t.Helper()
	var cur *v1beta1.RedisCluster
	Eventually(t, timeout, func() string {
		cur = f.Get(t, rc)
		if c := Condition(cur, v1beta1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Sprintf("RedisCluster %s/%s not Ready: %+v\npods:%s", rc.Namespace, rc.Name, c, f.PodSummary(rc.Namespace))
		}
		return ""
	})
	if c := Condition(cur, v1beta1.ConditionUsersApplied); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("RedisCluster %s/%s Ready while UsersApplied is %+v", rc.Namespace, rc.Name, c)
	}
	return cur
}
