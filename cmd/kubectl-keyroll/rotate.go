package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

func newRotateCommand(o *options) *cobra.Command {
	var (
		waitFor bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "rotate NAME",
		Short: "Ask for one rotation now: a new credential, rolled out to the Redis pods and consumers, then the old lease revoked",
		Long: `rotate sets the keyroll.dev/rotate-now annotation of a RedisCluster to a new value (the time
now). keyroll acts on a value once, and records it in status.rotateNowAcknowledged; while
rotations are paused the request waits until they are resumed. With --wait, rotate returns once
keyroll has acted on the request (a new credential is issued; its rollout then follows).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.rotate(cmd.Context(), args[0], waitFor, timeout)
		},
	}
	cmd.Flags().BoolVar(&waitFor, "wait", false, "Wait until keyroll has acted on the request.")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "How long --wait waits.")
	return cmd
}

func (o *options) rotate(ctx context.Context, name string, waitFor bool, timeout time.Duration) error {
	c, ns, err := o.newClient()
	if err != nil {
		return err
	}
	rc, err := getCluster(ctx, c, ns, name)
	if err != nil {
		return err
	}
	value := o.now().UTC().Format(time.RFC3339Nano)
	if prev := rc.Annotations[v1beta1.AnnotationRotateNow]; prev == value || rc.Status.RotateNowAcknowledged == v1beta1.Acknowledgement(value) {
		value += "-again"
	}
	before := rc.DeepCopy()
	if rc.Annotations == nil {
		rc.Annotations = map[string]string{}
	}
	rc.Annotations[v1beta1.AnnotationRotateNow] = value
	if err := c.Patch(ctx, rc, client.MergeFrom(before)); err != nil {
		return err
	}
	if o.output == "" {
		fmt.Fprintf(o.streams.Out, "rediscluster %s/%s: rotation requested (%s=%s)\n", rc.Namespace, rc.Name, v1beta1.AnnotationRotateNow, value)
		if rc.Spec.Rotation.Paused {
			fmt.Fprintf(o.streams.Out, "rotations are paused: keyroll acts on the request once they are resumed (kubectl keyroll resume %s)\n", rc.Name)
		}
	}
	if waitFor {
		if rc, err = o.waitAcknowledged(ctx, c, rc, value, timeout); err != nil {
			return err
		}
	}
	if o.output != "" {
		return o.print(viewOf(rc))
	}
	return nil
}

// waitAcknowledged polls until keyroll has acted on the rotate-now value.
func (o *options) waitAcknowledged(ctx context.Context, c client.Client, rc *v1beta1.RedisCluster, value string, timeout time.Duration) (*v1beta1.RedisCluster, error) {
	cur := rc
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		got, err := getCluster(ctx, c, rc.Namespace, rc.Name)
		if err != nil {
			return false, err
		}
		cur = got
		return got.Status.RotateNowAcknowledged == value, nil
	})
	if err != nil {
		return cur, fmt.Errorf("rediscluster %s/%s: keyroll has not acted on the rotation request within %s (phase %s): %w",
			rc.Namespace, rc.Name, timeout, orDash(string(cur.Status.Phase)), err)
	}
	if o.output == "" {
		version := "-"
		if cur.Status.Credential != nil {
			version = cur.Status.Credential.Version
		}
		fmt.Fprintf(o.streams.Out, "rediscluster %s/%s: rotated: credential version %s, rollout: %s\n", cur.Namespace, cur.Name, version, o.rollout(viewOf(cur)))
	}
	return cur, nil
}

// newPauseCommand is pause (paused true) or resume (paused false).
func newPauseCommand(o *options, paused bool) *cobra.Command {
	use, short := "resume NAME", "Let scheduled and requested rotations happen again"
	if paused {
		use, short = "pause NAME", "Stop scheduled and requested rotations (renewals, and replacing a lease that would lapse, go on)"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.setPaused(cmd.Context(), args[0], paused)
		},
	}
}

func (o *options) setPaused(ctx context.Context, name string, paused bool) error {
	c, ns, err := o.newClient()
	if err != nil {
		return err
	}
	rc, err := getCluster(ctx, c, ns, name)
	if err != nil {
		return err
	}
	was := rc.Spec.Rotation.Paused
	if was != paused {
		patch := fmt.Appendf(nil, `{"spec":{"rotation":{"paused":%t}}}`, paused)
		if err := c.Patch(ctx, rc, client.RawPatch("application/merge-patch+json", patch)); err != nil {
			return err
		}
	}
	if o.output != "" {
		return o.print(viewOf(rc))
	}
	state := "resumed"
	if paused {
		state = "paused (renewals go on)"
	}
	if was == paused {
		fmt.Fprintf(o.streams.Out, "rediscluster %s/%s: rotations already %s\n", rc.Namespace, rc.Name, state)
		return nil
	}
	fmt.Fprintf(o.streams.Out, "rediscluster %s/%s: rotations %s\n", rc.Namespace, rc.Name, state)
	return nil
}
