package training

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/testenv"
)

// A gang whose pods ask for 2 time-sliced GPUs each, on the one node its
// selector allows, whose device plugin runs time-slicing with
// failRequestsGreaterThanOne, can never run there (kubelet would fail each
// pod at admission): the job says so, naming the node, the config and the
// fix.
func TestAGangAskingMoreThanOneSharedGPUPerContainerNeverFits(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "onepercontainer")
	runAgent(t, "strict-0", collect.SimOptions{System: "dgx-h100"})
	startManager(t)
	const loomNS = "loom-system" // testenv.ManagerOptions
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dp-strict", Namespace: loomNS}, Data: map[string]string{
		"strict": "version: v1\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
	}}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "strict-sharing"},
		Spec: gpuv1alpha1.ClusterPolicySpec{DevicePlugin: gpuv1alpha1.DevicePluginSpec{Config: &gpuv1alpha1.DevicePluginConfig{ConfigMapName: cm.Name}}}}
	for _, o := range []client.Object{cm, cp} {
		create(t, o)
		t.Cleanup(func() { _ = env.Client.Delete(ctx, o) })
	}
	node := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "strict-0"}, node); err != nil {
		t.Fatal(err)
	}
	// Its 8 GPUs would otherwise count for the tests after this one.
	t.Cleanup(func() { _ = env.Client.Delete(ctx, node) })
	node.Labels = map[string]string{gpuv1alpha1.LabelDevicePluginConfig: "strict", "pool": "strict"}
	if err := env.Client.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	job := newJob(ns, "two-each", 1, 2, trainingv1alpha1.GangNone)
	for _, rs := range []*trainingv1alpha1.ReplicaSpec{&job.Spec.ReplicaSpecs.Master, job.Spec.ReplicaSpecs.Worker} {
		rs.Template.Spec.NodeSelector = map[string]string{"pool": "strict"}
	}
	create(t, job)
	testenv.Eventually(t, 30*time.Second, func() error {
		c := cond(getJob(t, job), trainingv1alpha1.ConditionScheduled)
		for _, want := range []string{"the device plugin of node strict-0 gives at most 1 nvidia.com/gpu to a container",
			`device plugin config "strict" of ConfigMap ` + loomNS + "/dp-strict, failRequestsGreaterThanOne: true",
			"ask for 1 nvidia.com/gpu per container, or set failRequestsGreaterThanOne: false"} {
			if c.Reason != ReasonNeverFits || !strings.Contains(c.Message, want) {
				return fmt.Errorf("Scheduled = %+v, want %s saying %q", c, ReasonNeverFits, want)
			}
		}
		return nil
	})
}
