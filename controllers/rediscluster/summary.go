package rediscluster

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/credential"
)

// concerns are the conditions that Degraded sums up, the most pressing first: leases not revoked, nodes
// without their users, a stuck rollout, a credential source that needs attention, a TLS certificate
// that cannot be used, a bad schedule.
var concerns = []string{
	v1beta1.ConditionLeasesRevoked, v1beta1.ConditionUsersApplied, v1beta1.ConditionRolloutHealthy,
	v1beta1.ConditionSourceHealthy, v1beta1.ConditionTLSReady, v1beta1.ConditionScheduleValid,
}

// inProgress are reasons of a False concern that are work going on (users being applied, a new
// certificate on its way to the nodes), not a problem.
var inProgress = []string{v1beta1.ReasonApplying, v1beta1.ReasonCertificatePending}

// summarize computes Ready and Degraded from the conditions of each concern, in this one place,
// so that two problems never overwrite each other: Degraded is True while any concern is False
// (with the first one's reason and every one's message); Ready is True when a live credential is
// in place, every Redis node accepts it and every Redis pod is Ready. Their events are those of the concerns.
func summarize(s *credential.Cluster) {
	rc := s.RC
	var reason string
	var msgs []string
	for _, t := range concerns {
		if c := meta.FindStatusCondition(rc.Status.Conditions, t); c != nil && c.Status == metav1.ConditionFalse && !slices.Contains(inProgress, c.Reason) {
			if reason == "" {
				reason = c.Reason
			}
			msgs = append(msgs, c.Message)
		}
	}
	if reason != "" {
		s.Conds.Set(v1beta1.ConditionDegraded, metav1.ConditionTrue, reason, strings.Join(msgs, "; "))
	} else {
		s.Conds.Set(v1beta1.ConditionDegraded, metav1.ConditionFalse, v1beta1.ReasonAvailable, "Nothing needs attention")
	}
	if !rc.DeletionTimestamp.IsZero() {
		return
	}
	creds := meta.FindStatusCondition(rc.Status.Conditions, v1beta1.ConditionCredentialsReady)
	users := meta.FindStatusCondition(rc.Status.Conditions, v1beta1.ConditionUsersApplied)
	switch {
	case creds == nil:
		s.Conds.Set(v1beta1.ConditionReady, metav1.ConditionFalse, v1beta1.ReasonReconciling, "Waiting for a credential")
	case creds.Status != metav1.ConditionTrue:
		s.Conds.Set(v1beta1.ConditionReady, metav1.ConditionFalse, creds.Reason, creds.Message)
	case users == nil:
		s.Conds.Set(v1beta1.ConditionReady, metav1.ConditionFalse, v1beta1.ReasonApplying, "Waiting for the Redis nodes to accept the credential")
	case users.Status != metav1.ConditionTrue:
		s.Conds.Set(v1beta1.ConditionReady, metav1.ConditionFalse, users.Reason, users.Message)
	case s.Conflict != "":
		s.Conds.Set(v1beta1.ConditionReady, metav1.ConditionFalse, v1beta1.ReasonSecretConflict, s.Conflict)
	case rc.Status.ReadyReplicas < rc.Spec.Replicas:
		s.Conds.Set(v1beta1.ConditionReady, metav1.ConditionFalse, v1beta1.ReasonReconciling, "Waiting for the Redis pods to be Ready")
	default:
		s.Conds.Set(v1beta1.ConditionReady, metav1.ConditionTrue, v1beta1.ReasonAvailable, "Redis runs with a live credential from Vault")
	}
}
