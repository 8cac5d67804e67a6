package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// clusterView is what status prints: the RedisCluster's state without anything secret (the
// status never holds a password; the plugin reads no Secret).
type clusterView struct {
	Namespace     string                    `json:"namespace"`
	Name          string                    `json:"name"`
	Phase         v1beta1.Phase             `json:"phase,omitempty"`
	Replicas      int32                     `json:"replicas"`
	ReadyReplicas int32                     `json:"readyReplicas"`
	Source        v1beta1.CredentialSource  `json:"source"`
	Rotation      rotationView              `json:"rotation"`
	Conditions    []metav1.Condition        `json:"conditions,omitempty"`
	Credential    *v1beta1.CredentialStatus `json:"credential,omitempty"`
	Leases        []v1beta1.LeaseRecord     `json:"leases"`
	Rollout       *v1beta1.RolloutStatus    `json:"rollout,omitempty"`
	Consumers     int                       `json:"consumers"`
	// RedisPods is the rollout's policy for the Redis pods: Live (users change on the running
	// nodes) or Restart.
	RedisPods v1beta1.RedisPodsPolicy `json:"redisPods"`
	// Nodes are the Redis nodes keyroll confirmed, and RetiringUsers the users it still has to
	// remove from them.
	Nodes         []v1beta1.NodeStatus `json:"nodes,omitempty"`
	RetiringUsers []string             `json:"retiringUsers,omitempty"`
	// Primary is the Redis pod that is the primary.
	Primary string `json:"primary,omitempty"`
	// OldUserClients are the clients still logged in with a superseded user that are not listed
	// consumers: its retirement waits for them.
	OldUserClients []v1beta1.OldUserClient `json:"oldUserClients,omitempty"`
	// ConsumersUsed are the workloads the last rollout of a credential used, and how keyroll
	// knows of each (status.consumers).
	ConsumersUsed []v1beta1.ConsumerInUse `json:"consumersUsed,omitempty"`
}

type rotationView struct {
	Schedule string `json:"schedule,omitempty"`
	Paused   bool   `json:"paused"`
	// RotateNow is the value of the keyroll.dev/rotate-now annotation, and Pending says keyroll
	// has not acted on it yet.
	RotateNow             string `json:"rotateNow,omitempty"`
	RotateNowAcknowledged string `json:"rotateNowAcknowledged,omitempty"`
	Pending               bool   `json:"pending"`
}

func viewOf(rc *v1beta1.RedisCluster) clusterView {
	now := rc.Annotations[v1beta1.AnnotationRotateNow]
	leases := rc.Status.Leases
	if leases == nil {
		leases = []v1beta1.LeaseRecord{}
	}
	return clusterView{
		Namespace: rc.Namespace, Name: rc.Name, Phase: rc.Status.Phase,
		Replicas: rc.Spec.Replicas, ReadyReplicas: rc.Status.ReadyReplicas,
		Source: rc.Spec.Credentials.Source,
		Rotation: rotationView{
			Schedule: rc.Spec.Rotation.Schedule, Paused: rc.Spec.Rotation.Paused,
			RotateNow: now, RotateNowAcknowledged: rc.Status.RotateNowAcknowledged,
			Pending: now != "" && rc.RotateNowRequest() != rc.Status.RotateNowAcknowledged,
		},
		Conditions: rc.Status.Conditions, Credential: rc.Status.Credential,
		Leases: leases, Rollout: rc.Status.Rollout, Consumers: len(rc.Spec.Rollout.Consumers),
		RedisPods: rc.Spec.Rollout.RedisPods, Nodes: rc.Status.Nodes, RetiringUsers: rc.Status.RetiringUsers,
		Primary: rc.Status.Primary, OldUserClients: rc.Status.OldUserClients, ConsumersUsed: rc.Status.Consumers,
	}
}

func newStatusCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "status NAME",
		Short: "Show a RedisCluster's phase, conditions, credential, lease ledger, rollout and next renewal and rotation",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, err := o.newClient()
			if err != nil {
				return err
			}
			rc, err := getCluster(cmd.Context(), c, ns, args[0])
			if err != nil {
				return err
			}
			if o.output != "" {
				return o.print(viewOf(rc))
			}
			return o.printStatus(rc)
		},
	}
}

// printStatus writes the human-readable status, section by section.
func (o *options) printStatus(rc *v1beta1.RedisCluster) error {
	v := viewOf(rc)
	w := printers.GetNewTabWriter(o.streams.Out)
	row := func(cells ...string) { fmt.Fprintln(w, strings.Join(cells, "\t")) }
	row("Name:", v.Namespace+"/"+v.Name)
	row("Phase:", orDash(string(v.Phase)))
	row("Redis pods:", fmt.Sprintf("%d/%d ready", v.ReadyReplicas, v.Replicas))
	row("Source:", o.source(rc))
	row("Rotation:", o.rotation(v.Rotation))
	w.Flush()

	fmt.Fprintln(o.streams.Out, "\nConditions:")
	if len(v.Conditions) == 0 {
		fmt.Fprintln(o.streams.Out, "  none yet")
	} else {
		row("  TYPE", "STATUS", "REASON", "SINCE", "MESSAGE")
		for _, c := range v.Conditions {
			row("  "+c.Type, string(c.Status), c.Reason, o.ago(c.LastTransitionTime), c.Message)
		}
		w.Flush()
	}

	fmt.Fprintln(o.streams.Out, "\nCredential:")
	if cr := v.Credential; cr == nil {
		fmt.Fprintln(o.streams.Out, "  none issued yet")
	} else {
		o.printCredential(w, cr)
		w.Flush()
	}

	fmt.Fprintln(o.streams.Out, "\nLeases:")
	o.printLedger(o.streams.Out, rc)

	fmt.Fprintln(o.streams.Out, "\nRedis nodes:")
	o.printNodes(w, v)

	fmt.Fprintln(o.streams.Out, "\nRollout:")
	fmt.Fprintf(o.streams.Out, "  %s\n", o.rollout(v))
	if len(v.ConsumersUsed) > 0 {
		fmt.Fprintln(o.streams.Out, "\nConsumers of the last rollout:")
		fmt.Fprintln(w, "  WORKLOAD\tVIA\tRESTARTED\tREFERENCES")
		for _, c := range v.ConsumersUsed {
			fmt.Fprintf(w, "  %s/%s\t%s\t%s\t%s\n", c.Kind, c.Name, c.Via, yesNo(c.Restarted), orDash(strings.Join(c.References, "; ")))
		}
		w.Flush()
	}
	if len(v.OldUserClients) > 0 {
		fmt.Fprintln(o.streams.Out, "\nStill logged in with a superseded user (not listed consumers; the user's retirement waits):")
		fmt.Fprintln(w, "  WORKLOAD\tADDRESS\tUSER\tCONNECTIONS\tSINCE")
		for _, c := range v.OldUserClients {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%d\t%s\n", orDash(c.Workload), c.Address, c.User, c.Connections, o.agoPtr(c.Since))
		}
		w.Flush()
	}
	return nil
}

// flusher is the tab writer printStatus writes its tables with.
type flusher interface {
	io.Writer
	Flush() error
}

// printNodes writes the Redis nodes keyroll confirmed the users on, and the users still to
// retire.
func (o *options) printNodes(w flusher, v clusterView) {
	if len(v.Nodes) == 0 {
		fmt.Fprintln(o.streams.Out, "  none confirmed yet")
	} else {
		fmt.Fprintln(w, "  POD\tROLE\tUSERS\tCONFIRMED")
		for _, n := range v.Nodes {
			role := v1beta1.RoleReplica
			if n.Pod == v.Primary {
				role = v1beta1.RolePrimary
			}
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", n.Pod, role, orDash(n.UsersVersion), o.agoPtr(n.ConfirmedAt))
		}
		w.Flush()
	}
	if len(v.RetiringUsers) > 0 {
		fmt.Fprintf(o.streams.Out, "  users still to remove from every node: %s\n", strings.Join(v.RetiringUsers, ", "))
	}
}

// printCredential writes the credential's rows; the caller flushes w.
func (o *options) printCredential(w io.Writer, cr *v1beta1.CredentialStatus) {
	row := func(cells ...string) { fmt.Fprintln(w, "  "+strings.Join(cells, "\t")) }
	row("Version:", orDash(cr.Version))
	row("Username:", orDash(cr.Username))
	if cr.ExternalSecret.LeasesTracked != nil && !*cr.ExternalSecret.LeasesTracked {
		row("Lease:", "not tracked (the ExternalSecret's generator does not hand over the lease)")
	} else {
		row("Lease:", orDash(cr.Lease.LeaseID))
	}
	row("Issued:", o.when(cr.IssuedAt))
	row("Expires:", o.when(cr.Lease.ExpiresAt))
	row("Renewable:", fmt.Sprint(cr.Lease.Renewable))
	if cr.Lease.RenewalCapped {
		row("Renewal capped:", "yes: the lease has reached its max TTL and is replaced before it lapses")
	}
	row("Token accessor:", orDash(cr.VaultLease.TokenAccessor))
	if cr.VaultLease.TokenEndsAt != nil {
		row("Token ends:", o.when(cr.VaultLease.TokenEndsAt))
	}
	row("Last renewal:", o.when(cr.Lease.LastRenewal))
	row("Next renewal:", o.when(cr.Lease.NextRenewal))
	row("Last rotation:", o.when(cr.LastRotation))
	delivered := o.when(cr.DeliveredAt)
	if cr.DeliveredAt == nil {
		delivered = "not yet (a scheduled rotation waits for it)"
	}
	row("Delivered:", delivered)
	row("Next rotation:", o.when(cr.NextRotation))
	if cr.ExternalSecret.RefreshRequestedAt != nil {
		row("Refresh requested:", o.when(cr.ExternalSecret.RefreshRequestedAt))
	}
}

// printLedger writes a RedisCluster's lease ledger as a table.
func (o *options) printLedger(out io.Writer, rc *v1beta1.RedisCluster) {
	if len(rc.Status.Leases) == 0 {
		fmt.Fprintln(out, "  none in the ledger")
		return
	}
	w := printers.GetNewTabWriter(out)
	fmt.Fprintln(w, "  LEASE\tSTATE\tEXPIRES\tCONNECTION\tTOKEN ACCESSOR\tVERSION")
	for _, l := range rc.Status.Leases {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\n", l.LeaseID, l.State, o.when(l.ExpiresAt),
			orDash(l.Connection), orDash(l.TokenAccessor), orDash(l.Version))
	}
	w.Flush()
}

func (o *options) source(rc *v1beta1.RedisCluster) string {
	cr := rc.Spec.Credentials
	switch {
	case cr.VaultLease != nil:
		return fmt.Sprintf("%s: %s through VaultConnection %s", cr.Source, cr.VaultLease.Path, cr.VaultLease.ConnectionRef.Name)
	case cr.ExternalSecret != nil && cr.ExternalSecret.GeneratorRef != nil:
		g := cr.ExternalSecret.GeneratorRef
		return fmt.Sprintf("%s: generator %s %s", cr.Source, g.Kind, g.Name)
	case cr.ExternalSecret != nil && cr.ExternalSecret.StoreRef != nil:
		return fmt.Sprintf("%s: %s from store %s", cr.Source, cr.ExternalSecret.RemoteKey, cr.ExternalSecret.StoreRef.Name)
	}
	return string(cr.Source)
}

func (o *options) rotation(r rotationView) string {
	var parts []string
	if r.Schedule != "" {
		parts = append(parts, fmt.Sprintf("schedule %q", r.Schedule))
	} else {
		parts = append(parts, "no schedule")
	}
	if r.Paused {
		parts = append(parts, "paused (renewals go on)")
	}
	if r.Pending {
		parts = append(parts, fmt.Sprintf("rotate-now %q requested, not yet acted upon", r.RotateNow))
	}
	return strings.Join(parts, ", ")
}

func (o *options) rollout(v clusterView) string {
	r := v.Rollout
	if r == nil {
		return "none in progress"
	}
	if r.Cause == v1beta1.RolloutForPodTemplate {
		s := fmt.Sprintf("of the Redis pods onto their new template: %d/%d updated", r.PodsUpdated, v.Replicas)
		if r.PodInFlight != "" {
			s += fmt.Sprintf(", %s in flight (restarted %s)", r.PodInFlight, o.agoPtr(r.PodRestartedAt))
		}
		return s + ", started " + o.agoPtr(r.StartedAt)
	}
	if v.RedisPods != v1beta1.RedisPodsRestart {
		return fmt.Sprintf("to version %s, which every Redis node accepts: %d/%d consumers updated, started %s",
			orDash(r.TargetVersion), r.ConsumersUpdated, v.Consumers, o.agoPtr(r.StartedAt))
	}
	s := fmt.Sprintf("to version %s: %d/%d Redis pods updated", orDash(r.TargetVersion), r.PodsUpdated, v.Replicas)
	if r.PodInFlight != "" {
		s += fmt.Sprintf(", %s in flight (restarted %s)", r.PodInFlight, o.agoPtr(r.PodRestartedAt))
	}
	s += fmt.Sprintf(", %d/%d consumers updated, started %s", r.ConsumersUpdated, v.Consumers, o.agoPtr(r.StartedAt))
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
