package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// NewCommand is `kubectl proxyshift` with its subcommands. It honours
// kubectl's connection flags (--kubeconfig, --context, --server, ...)
// through cli-runtime, like every kubectl command.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	return newCommand(streams, time.Now)
}

// newCommand is NewCommand with the clock ages are measured against.
func newCommand(streams genericiooptions.IOStreams, now func() time.Time) *cobra.Command {
	flags := genericclioptions.NewConfigFlags(false)
	o := &options{streams: streams, now: now}
	root := &cobra.Command{
		Use:           "kubectl-proxyshift",
		Short:         "See and steer proxyshift rollouts: which node runs which proxy mode, and where each rollout stands.",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			cfg, err := flags.ToRESTConfig()
			if err != nil {
				return err
			}
			o.client, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme()})
			return err
		},
	}
	flags.AddFlags(root.PersistentFlags())
	root.PersistentFlags().StringVarP(&o.output, "output", "o", "", "Output format: json or yaml (default: a table).")

	var watchFlag bool
	status := &cobra.Command{
		Use:   "status [PROXYCONFIG]",
		Short: "Show each rollout (or the named one) with the nodes it moves: desired and active mode, phase, and why a node is unhealthy.",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			if watchFlag {
				return o.watchStatus(cmd.Context(), name)
			}
			return o.status(cmd.Context(), name)
		},
	}
	status.Flags().BoolVarP(&watchFlag, "watch", "w", false, "Print the picture again whenever it changes, until interrupted.")
	nodes := &cobra.Command{
		Use:   "nodes",
		Short: "Show every node: who serves it, what it is asked for, phase, rule counts and last sync.",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return o.nodes(cmd.Context()) },
	}
	pause := &cobra.Command{
		Use:   "pause PROXYCONFIG",
		Short: "Stop the rollout from starting more nodes (nodes in transition finish).",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.setRollout(cmd.Context(), args[0], "paused", true, "paused")
		},
	}
	resume := &cobra.Command{
		Use:   "resume PROXYCONFIG",
		Short: "Let a paused rollout go on where it stopped.",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.setRollout(cmd.Context(), args[0], "paused", false, "resumed")
		},
	}
	root.AddCommand(status, nodes, pause, resume, newPlanCommand(o), newRollbackCommand(o), findingsCommand(o))
	return root
}

// options is what every subcommand shares.
type options struct {
	streams genericiooptions.IOStreams
	client  client.WithWatch
	output  string
	now     func() time.Time
}

// scheme knows proxyshift's kinds (and the built-in ones, for errors).
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// read lists the named config (or every config) and every ProxyNode.
func (o *options) read(ctx context.Context, name string) ([]v1alpha1.ProxyConfig, []v1alpha1.ProxyNode, error) {
	var cfgs []v1alpha1.ProxyConfig
	if name != "" {
		var c v1alpha1.ProxyConfig
		if err := o.client.Get(ctx, types.NamespacedName{Name: name}, &c); err != nil {
			return nil, nil, err
		}
		cfgs = []v1alpha1.ProxyConfig{c}
	} else {
		var l v1alpha1.ProxyConfigList
		if err := o.client.List(ctx, &l); err != nil {
			return nil, nil, err
		}
		cfgs = l.Items
	}
	var pns v1alpha1.ProxyNodeList
	if err := o.client.List(ctx, &pns); err != nil {
		return nil, nil, err
	}
	return cfgs, pns.Items, nil
}

// status prints the rollouts once.
func (o *options) status(ctx context.Context, name string) error {
	cfgs, pns, err := o.read(ctx, name)
	if err != nil {
		return err
	}
	if o.output != "" {
		var items []runtime.Object
		for i := range cfgs {
			items = append(items, &cfgs[i])
			for _, pn := range nodesOf(cfgs[i].Name, pns) {
				items = append(items, &pn)
			}
		}
		return o.print(items)
	}
	if len(cfgs) == 0 {
		_, err := fmt.Fprintln(o.streams.Out, "No ProxyConfig found: nothing is being rolled out.")
		return err
	}
	return RenderStatus(o.streams.Out, cfgs, pns, o.now())
}

// watchStatus prints the picture, then again after every change of a
// ProxyConfig or ProxyNode that changes it, until ctx ends, which is no
// error (a read or watch cut short by it included).
func (o *options) watchStatus(ctx context.Context, name string) error {
	if err := o.watchStatusUntil(ctx, name); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

func (o *options) watchStatusUntil(ctx context.Context, name string) error {
	var last []byte
	show := func() error {
		cfgs, pns, err := o.read(ctx, name)
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if err := RenderStatus(&b, cfgs, pns, o.now()); err != nil {
			return err
		}
		if !bytes.Equal(b.Bytes(), last) {
			fmt.Fprintf(o.streams.Out, "--- %s\n", o.now().Format(time.TimeOnly))
			if _, err := o.streams.Out.Write(b.Bytes()); err != nil {
				return err
			}
			last = b.Bytes()
		}
		return nil
	}
	for {
		if err := show(); err != nil {
			return err
		}
		// Watches end now and then (the server's timeout); start again.
		cw, err := o.client.Watch(ctx, &v1alpha1.ProxyConfigList{})
		if err != nil {
			return err
		}
		nw, err := o.client.Watch(ctx, &v1alpha1.ProxyNodeList{})
		if err != nil {
			cw.Stop()
			return err
		}
		err = untilClosed(ctx, show, cw, nw)
		cw.Stop()
		nw.Stop()
		if err != nil || ctx.Err() != nil {
			return err
		}
	}
}

// untilClosed calls show after each event of either watch, until one
// closes or ctx ends.
func untilClosed(ctx context.Context, show func() error, configs, nodes watch.Interface) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-configs.ResultChan():
			if !ok {
				return nil
			}
		case _, ok := <-nodes.ResultChan():
			if !ok {
				return nil
			}
		}
		if err := show(); err != nil {
			return err
		}
	}
}

// nodes prints every ProxyNode.
func (o *options) nodes(ctx context.Context) error {
	var l v1alpha1.ProxyNodeList
	if err := o.client.List(ctx, &l); err != nil {
		return err
	}
	if o.output != "" {
		items := make([]runtime.Object, len(l.Items))
		for i := range l.Items {
			items[i] = &l.Items[i]
		}
		return o.print(items)
	}
	return RenderNodes(o.streams.Out, l.Items, o.now())
}

// setRollout sets one boolean field of spec.rollout with a merge patch
// (nothing else of the spec is sent, so concurrent edits of other fields
// are kept), and says what was done.
func (o *options) setRollout(ctx context.Context, name, field string, value bool, done string) error {
	c := &v1alpha1.ProxyConfig{}
	c.Name = name
	patch := fmt.Sprintf(`{"spec":{"rollout":{%q:%v}}}`, field, value)
	if err := o.client.Patch(ctx, c, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return err
	}
	_, err := fmt.Fprintf(o.streams.Out, "proxyconfig/%s %s\n", name, done)
	return err
}

// print writes objects as a kubectl List in the -o format.
func (o *options) print(items []runtime.Object) error {
	for _, it := range items {
		gvks, _, err := scheme().ObjectKinds(it)
		if err != nil {
			return err
		}
		it.GetObjectKind().SetGroupVersionKind(gvks[0])
	}
	if items == nil {
		items = []runtime.Object{}
	}
	return o.encode(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
}

// encode writes v in the -o format (json or yaml).
func (o *options) encode(v any) error {
	var out []byte
	var err error
	switch o.output {
	case "json":
		out, err = json.MarshalIndent(v, "", "    ")
		out = append(out, '\n')
	case "yaml":
		out, err = yaml.Marshal(v)
	default:
		return fmt.Errorf("--output %q: want json or yaml", o.output)
	}
	if err != nil {
		return err
	}
	_, err = io.Copy(o.streams.Out, bytes.NewReader(out))
	return err
}
