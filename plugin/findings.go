package plugin

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/findings"
)

// findingsCommand is `kubectl proxyshift findings PROXYCONFIG`: what will
// behave differently on the nodes the config still has to move, and which
// Critical findings hold its rollout.
func findingsCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use: "findings PROXYCONFIG",
		Short: "Show what will behave differently on the nodes the rollout still has to move (status.findings), " +
			"and which Critical findings hold it until spec.rollout.acknowledgedFindings lists them.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return o.findings(cmd.Context(), args[0]) },
	}
}

// findings prints one config's findings: a table, or with -o the list of
// findings itself.
func (o *options) findings(ctx context.Context, name string) error {
	var c v1alpha1.ProxyConfig
	if err := o.client.Get(ctx, types.NamespacedName{Name: name}, &c); err != nil {
		return err
	}
	if o.output != "" {
		fs := c.Status.Findings
		if fs == nil {
			fs = []v1alpha1.Finding{}
		}
		return o.encode(fs)
	}
	return RenderFindings(o.streams.Out, &c)
}

// tableObjects is how many of a finding's objects the table names; -o
// json|yaml has them all.
const tableObjects = 3

// RenderFindings writes a config's findings, most severe first as the
// status holds them: a summary line, then per finding its severity, code,
// count, whether it is acknowledged (Critical ones), the first three
// objects, and below it what
// changes and what to do.
func RenderFindings(w io.Writer, c *v1alpha1.ProxyConfig) error {
	fs := c.Status.Findings
	if len(fs) == 0 {
		_, err := fmt.Fprintf(w, "proxyconfig/%s: no findings: the nodes still to move to %s will behave as they do now, as far as proxyshift knows\n",
			c.Name, c.Spec.Mode)
		return err
	}
	acked := c.Spec.Rollout.AcknowledgedFindings
	var holding []string
	for _, f := range findings.Unacknowledged(fs, acked) {
		holding = append(holding, f.Code)
	}
	fmt.Fprintf(w, "proxyconfig/%s: %d findings for the nodes still to move to %s", c.Name, len(fs), c.Spec.Mode)
	if len(holding) > 0 {
		fmt.Fprintf(w, "; the rollout holds until spec.rollout.acknowledgedFindings lists %s", strings.Join(holding, ", "))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "SEVERITY\tCODE\tCOUNT\tACKNOWLEDGED\tOBJECTS\n")
	for _, f := range fs {
		ack := "-"
		if f.Severity == v1alpha1.SeverityCritical {
			ack = fmt.Sprint(slices.Contains(acked, f.Code))
		}
		shown := f.Objects[:min(len(f.Objects), tableObjects)]
		objs := strings.Join(shown, ",")
		if more := int(f.Count) - len(shown); more > 0 {
			objs += fmt.Sprintf(" and %d more", more)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", f.Severity, f.Code, f.Count, ack, orNone(objs))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range fs {
		if _, err := fmt.Fprintf(w, "\n%s: %s\n  what to do: %s\n", f.Code, f.Message, f.Action); err != nil {
			return err
		}
	}
	return nil
}
