package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
	"github.com/loom-dev/loom/internal/why"
)

// lastEvents is how many Warning events why shows.
const lastEvents = 5

// kinds are the kinds why explains, by every name kubectl users type.
var kinds = map[string]string{
	"trainingjob": "TrainingJob", "trainingjobs": "TrainingJob", "tj": "TrainingJob", "trainingjob.training.loom.dev": "TrainingJob",
	"raycluster": "RayCluster", "rayclusters": "RayCluster", "rc": "RayCluster", "raycluster.ray.io": "RayCluster",
	"rayjob": "RayJob", "rayjobs": "RayJob", "rayjob.ray.io": "RayJob",
	"clusterpolicy": "ClusterPolicy", "clusterpolicies": "ClusterPolicy", "cp": "ClusterPolicy", "clusterpolicy.gpu.loom.dev": "ClusterPolicy",
	"gpunode": "GPUNode", "gpunodes": "GPUNode", "gpun": "GPUNode", "gpunode.gpu.loom.dev": "GPUNode",
	"node": "Node", "nodes": "Node", "no": "Node",
}

// parseTarget reads kind/name or kind name.
func parseTarget(args []string) (kind, name string, err error) {
	var k string
	switch {
	case len(args) == 1 && strings.Count(args[0], "/") == 1:
		k, name, _ = strings.Cut(args[0], "/")
	case len(args) == 2:
		k, name = args[0], args[1]
	default:
		return "", "", fmt.Errorf("expected <kind>/<name> or <kind> <name>, e.g. trainingjob/bert")
	}
	kind, ok := kinds[strings.ToLower(k)]
	if !ok {
		return "", "", fmt.Errorf("kubectl loom why does not explain %q: use trainingjob (tj), raycluster (rc), rayjob, clusterpolicy (cp), gpunode or node", k)
	}
	if name == "" {
		return "", "", fmt.Errorf("no name given: expected %s/<name>", k)
	}
	return kind, name, nil
}

func newWhyCommand(o *options) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "why <kind>/<name>",
		Short: "Say in one line why an object is where it is, what to do, and its last Warning events",
		Long: `Say in one line why an object is where it is (from its conditions, labels and
taints), what to do when the reason is a known one, and its last Warning events.

Kinds: trainingjob (tj), raycluster (rc), rayjob, clusterpolicy (cp), gpunode, node.`,
		Example: `  kubectl loom why trainingjob/bert -n ml
  kubectl loom why cp/default
  kubectl loom why node/gpu-17`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			kind, name, err := parseTarget(args)
			if err != nil {
				return err
			}
			a, err := o.why(cmd.Context(), kind, name)
			if err != nil {
				return err
			}
			if out == "json" || out == "yaml" {
				return o.printData(out, a)
			}
			return why.WriteAnswer(o.streams.Out, a)
		},
	}
	addOutput(cmd, &out)
	return cmd
}

// why reads the object (and what its answer needs) and answers.
func (o *options) why(ctx context.Context, kind, name string) (why.Answer, error) {
	c, err := o.client()
	if err != nil {
		return why.Answer{}, err
	}
	ns, err := o.namespace()
	if err != nil {
		return why.Answer{}, err
	}
	var src sharing.Source
	if kind == "TrainingJob" || kind == "Node" {
		if src, err = sharingSource(ctx, c); err != nil {
			return why.Answer{}, err
		}
	}
	names := sharing.NamesOf(src)
	var a why.Answer
	var obj client.Object
	switch kind {
	case "TrainingJob":
		tj := &trainingv1alpha1.TrainingJob{}
		obj, err = tj, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, tj)
		if err == nil {
			a = why.TrainingJob(tj, names)
			err = gpusNow(ctx, c, tj, src, &a)
		}
	case "RayCluster":
		rc := &rayv1.RayCluster{}
		obj, err = rc, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, rc)
		if err == nil {
			a = why.RayCluster(rc)
		}
	case "RayJob":
		job := &rayv1.RayJob{}
		obj, err = job, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, job)
		if err == nil {
			a = why.RayJob(job)
		}
	case "ClusterPolicy":
		cp := &gpuv1alpha1.ClusterPolicy{}
		obj, err = cp, c.Get(ctx, client.ObjectKey{Name: name}, cp)
		if err == nil {
			a = why.ClusterPolicy(cp)
		}
	case "GPUNode":
		gn := &gpuv1alpha1.GPUNode{}
		obj, err = gn, c.Get(ctx, client.ObjectKey{Name: name}, gn)
		if err == nil {
			a = why.GPUNode(gn)
		}
	case "Node":
		obj, a, err = o.whyNode(ctx, c, name, names)
	}
	if err != nil {
		return why.Answer{}, explainGet(err, kind, name, ns)
	}
	evs, err := o.warnings(ctx, c, kind, obj)
	switch {
	case apierrors.IsForbidden(err):
		// The answer stands without them: say what is left out and why.
		a.Also = append(a.Also, "Warning events: not shown: "+forbiddenWhat(err))
	case err != nil:
		return why.Answer{}, fmt.Errorf("listing the events of %s: %w", a.Object, err)
	default:
		a.Events = evs
	}
	return a, nil
}

// explainGet adds to an error reading the object what the user most
// likely needs: the CRD its kind needs is not served (Loom, or KubeRay's
// RayCluster CRD, is not installed), or the object is not in the
// namespace looked in (-n, else the context's).
func explainGet(err error, kind, name, ns string) error {
	switch {
	case meta.IsNoMatchError(err) && (kind == "RayCluster" || kind == "RayJob"):
		return fmt.Errorf("%w: the cluster does not serve KubeRay's %s CRD (the Loom manager applies it at start unless --install-ray-crd=false)", err, kind)
	case meta.IsNoMatchError(err):
		return fmt.Errorf("%w: the cluster does not serve Loom's %s CRD: is Loom installed? (helm install loom charts/loom)", err, kind)
	case apierrors.IsNotFound(err) && (kind == "TrainingJob" || kind == "RayCluster" || kind == "RayJob"):
		return fmt.Errorf("%s %q not found in namespace %q (another namespace: -n <namespace>)", strings.ToLower(kind), name, ns)
	}
	return err
}

// forbiddenWhat is a Forbidden error's message, for a line saying what the
// answer leaves out (a user whose rights end at their namespace reads
// their own objects, not the cluster's nodes and pods).
func forbiddenWhat(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Message != "" {
		return status.Status().Message
	}
	return err.Error()
}

// gpusNow adds to a waiting job's answer the live GPU picture its status
// leaves out (it would move at every allocation): computed here, from the
// nodes, GPUNodes and bound pods, as kubectl loom gpus reads them.
func gpusNow(ctx context.Context, c client.Client, tj *trainingv1alpha1.TrainingJob, src sharing.Source, a *why.Answer) error {
	if !why.WaitsToBeScheduled(tj) {
		return nil
	}
	err := addGPUsNow(ctx, c, tj, src, a)
	if apierrors.IsForbidden(err) {
		// The picture needs every node and pod: a user whose rights end at
		// their namespace still gets the job's own answer.
		a.Also = append(a.Also, "GPUs now: not shown: "+forbiddenWhat(err))
		return nil
	}
	return err
}

func addGPUsNow(ctx context.Context, c client.Client, tj *trainingv1alpha1.TrainingJob, src sharing.Source, a *why.Answer) error {
	nodes, err := listNodes(ctx, c)
	if err != nil {
		return err
	}
	var gns []gpuv1alpha1.GPUNode
	gl := &gpuv1alpha1.GPUNodeList{}
	if err := pages(ctx, c, gl, func() { gns = append(gns, gl.Items...) }); err != nil && !meta.IsNoMatchError(err) {
		return err
	}
	var pods []corev1.Pod
	pl := &corev1.PodList{}
	if err := pages(ctx, c, pl, func() { pods = append(pods, pl.Items...) }, client.MatchingFieldsSelector{Selector: boundPods}); err != nil {
		return err
	}
	if now := why.TrainingJobGPUsNow(tj, src, nodes, gns, pods); now != "" {
		a.Also = append(a.Also, now)
	}
	return nil
}

// whyNode reads a node and its GPUNode (none when the CRD or the object is
// missing).
func (o *options) whyNode(ctx context.Context, c client.Client, name string, names sharing.Names) (client.Object, why.Answer, error) {
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return nil, why.Answer{}, err
	}
	gn := &gpuv1alpha1.GPUNode{}
	switch err := c.Get(ctx, client.ObjectKey{Name: name}, gn); {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		gn = nil
	case err != nil:
		return nil, why.Answer{}, err
	}
	return node, why.Node(node, gn, names), nil
}

// warnings are the object's last Warning events: its namespace's for a
// namespaced object, every namespace's for a cluster-scoped one.
func (o *options) warnings(ctx context.Context, c client.Client, kind string, obj client.Object) ([]string, error) {
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": obj.GetName(), "type": corev1.EventTypeWarning}
	if kind != "Node" {
		// A Node's events name its name as UID (the kubelet's habit).
		sel["involvedObject.uid"] = string(obj.GetUID())
	}
	var events []corev1.Event
	list := &corev1.EventList{}
	err := pages(ctx, c, list, func() { events = append(events, list.Items...) },
		client.InNamespace(obj.GetNamespace()), client.MatchingFieldsSelector{Selector: sel.AsSelector()})
	if err != nil {
		return nil, err
	}
	return why.Warnings(events, lastEvents, o.now()), nil
}
