package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// options are what every command shares: the kubeconfig flags (--kubeconfig, --context,
// --namespace, ...), the output format, the streams and the clock.
type options struct {
	streams genericiooptions.IOStreams
	flags   *genericclioptions.ConfigFlags
	output  string
	now     func() time.Time
	// newClient returns a client and the namespace to work in (from --namespace or the
	// kubeconfig's context); tests replace it with a fake.
	newClient func() (client.Client, string, error)
}

func newRootCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{streams: streams, flags: genericclioptions.NewConfigFlags(true), now: time.Now}
	o.newClient = o.kubeClient
	return o.command()
}

// command is the root command with its subcommands, all sharing o.
func (o *options) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kubectl-keyroll",
		Short: "Operate keyroll's RedisClusters: credential, lease ledger, rollout, rotations",
		Long: `kubectl keyroll shows and steers keyroll's RedisClusters.

  status NAME    phase, conditions, the credential (never its password), the lease ledger with
                 each lease's state, expiry, connection and token accessor, the rollout's progress,
                 and when the next renewal and rotation are due
  rotate NAME    ask for one rotation now (the keyroll.dev/rotate-now annotation)
  pause NAME     stop scheduled and requested rotations (renewals go on)
  resume NAME    let rotations happen again
  leases         every lease keyroll holds in the namespace, or in all of them with -A

-o json or -o yaml prints the same for scripts.`,
		Annotations:       map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl keyroll"},
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(*cobra.Command, []string) error { return o.validateOutput() },
	}
	cmd.SetIn(o.streams.In)
	cmd.SetOut(o.streams.Out)
	cmd.SetErr(o.streams.ErrOut)
	o.flags.AddFlags(cmd.PersistentFlags())
	cmd.PersistentFlags().StringVarP(&o.output, "output", "o", "", "Output format: empty for a human-readable table, json or yaml.")
	cmd.AddCommand(newStatusCommand(o), newRotateCommand(o), newPauseCommand(o, true), newPauseCommand(o, false), newLeasesCommand(o))
	return cmd
}

func (o *options) validateOutput() error {
	switch o.output {
	case "", "json", "yaml":
		return nil
	}
	return fmt.Errorf("unknown output format %q: use json or yaml, or leave -o out for a table", o.output)
}

// kubeClient builds a client for keyroll's API from the kubeconfig flags.
func (o *options) kubeClient() (client.Client, string, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	ns, _, err := o.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", err
	}
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", err
	}
	return c, ns, nil
}

// getCluster reads one RedisCluster, with an error that says what is missing.
func getCluster(ctx context.Context, c client.Client, namespace, name string) (*v1beta1.RedisCluster, error) {
	rc := &v1beta1.RedisCluster{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, rc); err != nil {
		return nil, explain(err)
	}
	return rc, nil
}

// explain turns a missing CRD into advice.
func explain(err error) error {
	if meta.IsNoMatchError(err) {
		return fmt.Errorf("the RedisCluster API (keyroll.dev/v1beta1) is not installed in this cluster; install keyroll first: %w", err)
	}
	return err
}

// print writes v as JSON or YAML.
func (o *options) print(v any) error {
	switch o.output {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(o.streams.Out, "%s\n", b)
		return err
	default:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = o.streams.Out.Write(b)
		return err
	}
}
