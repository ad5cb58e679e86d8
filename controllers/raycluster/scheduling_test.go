package raycluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/testenv"
)

// Loom's check of the templates' tolerations and affinity agrees with the
// API server's: each case's worker pod, built from the cluster, is
// created (dry run) on a real API server, refused exactly when Loom holds
// the cluster, and Loom names the field the server names.
func TestTemplateSchedulingAgreesWithTheAPIServer(t *testing.T) {
	ctx := context.Background()
	term := func(r ...corev1.NodeSelectorRequirement) *corev1.Affinity {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: r}}}}}
	}
	anti := func(pt corev1.PodAffinityTerm, w int32) *corev1.Affinity {
		return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: w, PodAffinityTerm: pt}}}}
	}
	tests := []struct {
		name        string
		tolerations []corev1.Toleration
		affinity    *corev1.Affinity
		field       string // the field both name; "" when both accept
	}{
		{name: "valid tolerations", tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}, {Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
			{Key: "k", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](30)}}},
		{name: "operator Foo", tolerations: []corev1.Toleration{{Key: "k", Operator: "Foo"}}, field: "tolerations[0].operator"},
		{name: "effect Bad", tolerations: []corev1.Toleration{{Key: "k", Effect: "Bad"}}, field: "tolerations[0].effect"},
		{name: "empty key with Equal", tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpEqual}}, field: "tolerations[0].operator"},
		{name: "value with Exists", tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, Value: "v"}}, field: "tolerations[0]"},
		{name: "key not a label key", tolerations: []corev1.Toleration{{Key: "a b", Value: "v"}}, field: "tolerations[0].key"},
		{name: "value not a label value", tolerations: []corev1.Toleration{{Key: "k", Value: "a b"}}, field: "tolerations[0]"},
		{name: "tolerationSeconds without NoExecute", tolerations: []corev1.Toleration{{Key: "k", Effect: corev1.TaintEffectNoSchedule, TolerationSeconds: ptr.To[int64](1)}}, field: "tolerations[0].effect"},
		{name: "valid node affinity", affinity: term(corev1.NodeSelectorRequirement{Key: "gpu", Operator: corev1.NodeSelectorOpIn, Values: []string{"a100"}},
			corev1.NodeSelectorRequirement{Key: "gpus", Operator: corev1.NodeSelectorOpGt, Values: []string{"4"}})},
		{name: "node affinity operator Foo", affinity: term(corev1.NodeSelectorRequirement{Key: "gpu", Operator: "Foo"}), field: "matchExpressions[0].operator"},
		{name: "node affinity In without values", affinity: term(corev1.NodeSelectorRequirement{Key: "gpu", Operator: corev1.NodeSelectorOpIn}), field: "matchExpressions[0].values"},
		{name: "node affinity Gt with two values", affinity: term(corev1.NodeSelectorRequirement{Key: "gpu", Operator: corev1.NodeSelectorOpGt, Values: []string{"1", "2"}}), field: "matchExpressions[0].values"},
		{name: "no node selector terms", affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{}}},
			field: "nodeSelectorTerms"},
		{name: "valid pod anti-affinity", affinity: anti(corev1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname",
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ray.io/cluster": "c"}}}, 50)},
		{name: "pod anti-affinity weight", affinity: anti(corev1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname"}, 0), field: "[0].weight"},
		{name: "pod anti-affinity without topology key", affinity: anti(corev1.PodAffinityTerm{}, 1), field: "topologyKey"},
		{name: "pod anti-affinity selector operator", affinity: anti(corev1.PodAffinityTerm{TopologyKey: "zone",
			LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Foo"}}}}, 1), field: "labelSelector.matchExpressions[0].operator"},
	}
	if err := env.CreateNamespace(ctx, "scheduling-agree"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := unitCluster(t, func(rc *rayv1.RayCluster) {
				rc.Namespace = "scheduling-agree"
				rc.Spec.WorkerGroupSpecs[0].Template.Spec.Tolerations = tt.tolerations
				rc.Spec.WorkerGroupSpecs[0].Template.Spec.Affinity = tt.affinity
			})
			ours := validateCluster(rc, "none")
			pod := buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[0], "")
			pod.OwnerReferences = nil
			theirs := env.Client.Create(ctx, pod, client.DryRunAll)
			if theirs != nil && !apierrors.IsInvalid(theirs) {
				t.Fatalf("dry run: %v", theirs)
			}
			switch {
			case tt.field == "" && (ours != nil || theirs != nil):
				t.Fatalf("a valid template: Loom %v; the API server %v", ours, theirs)
			case tt.field != "" && (ours == nil || theirs == nil):
				t.Fatalf("refused by Loom: %v; by the API server: %v", ours, theirs)
			case tt.field != "" && (!strings.Contains(ours.Error(), tt.field) || !strings.Contains(theirs.Error(), tt.field)):
				t.Fatalf("the field %s, named by Loom: %v; by the API server: %v", tt.field, ours, theirs)
			}
		})
	}
}

// A RayCluster whose worker template carries a toleration the API server
// refuses is held before anything is made: no head pod, no Service, and
// loom.dev/SpecValid naming the field.
func TestInvalidTolerationHoldsTheCluster(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "bad-toleration")
	rc.Spec.WorkerGroupSpecs[0].Template.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: "Foo", Effect: "Bad"}}
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionValid)
		if c == nil || c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, `spec.workerGroupSpecs[0].template.spec.tolerations[0].operator: unsupported value "Foo"`) {
			return fmt.Errorf("SpecValid %+v", c)
		}
		return nil
	})
	var svcs corev1.ServiceList
	if err := env.Client.List(ctx, &svcs, client.InNamespace(rc.Namespace)); err != nil {
		t.Fatal(err)
	}
	if pods := rayPods(t, rc); len(pods) != 0 || len(svcs.Items) != 0 {
		t.Fatalf("a held cluster made %d pod groups and %d Services", len(pods), len(svcs.Items))
	}
}
