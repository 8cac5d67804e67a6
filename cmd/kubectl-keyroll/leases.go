package main

import (
	"context"
	"fmt"
	"sort"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// leaseView is one lease of a ledger, with the RedisCluster that holds it.
type leaseView struct {
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
	v1beta1.LeaseRecord
}

type leaseList struct {
	Items []leaseView `json:"items"`
}

func newLeasesCommand(o *options) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "leases",
		Short: "List every Vault lease keyroll holds for the RedisClusters of a namespace (or all, with -A)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.leases(cmd.Context(), all)
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "List the leases of every namespace.")
	return cmd
}

func (o *options) leases(ctx context.Context, all bool) error {
	c, ns, err := o.newClient()
	if err != nil {
		return err
	}
	list := &v1beta1.RedisClusterList{}
	var opts []client.ListOption
	if !all {
		opts = append(opts, client.InNamespace(ns))
	}
	if err := c.List(ctx, list, opts...); err != nil {
		return explain(err)
	}
	sort.Slice(list.Items, func(i, j int) bool {
		a, b := list.Items[i], list.Items[j]
		return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
	})
	out := leaseList{Items: []leaseView{}}
	for _, rc := range list.Items {
		for _, l := range rc.Status.Leases {
			out.Items = append(out.Items, leaseView{Namespace: rc.Namespace, Cluster: rc.Name, LeaseRecord: l})
		}
	}
	if o.output != "" {
		return o.print(out)
	}
	if len(out.Items) == 0 {
		where := fmt.Sprintf("namespace %s", ns)
		if all {
			where = "any namespace"
		}
		fmt.Fprintf(o.streams.ErrOut, "No leases held by keyroll in %s.\n", where)
		return nil
	}
	w := printers.GetNewTabWriter(o.streams.Out)
	if all {
		fmt.Fprint(w, "NAMESPACE\t")
	}
	fmt.Fprintln(w, "CLUSTER\tLEASE\tSTATE\tEXPIRES\tCONNECTION\tTOKEN ACCESSOR")
	for _, l := range out.Items {
		if all {
			fmt.Fprintf(w, "%s\t", l.Namespace)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", l.Cluster, l.LeaseID, l.State, o.when(l.ExpiresAt), orDash(l.Connection), orDash(l.TokenAccessor))
	}
	return w.Flush()
}
