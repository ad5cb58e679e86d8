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

// FuzzTemplateScheduling feeds the template checks any toleration, any
// node selector requirement and pod affinity term, each part nil, empty or
// set, and any priority-class label. Invariants: no panic; a cluster they
// refuse is held (nothing created, no child, no PodGroup).
func FuzzTemplateScheduling(f *testing.F) {
	base, err := testenv.KubeRaySample("ray-cluster.sample.yaml", "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	base.UID = "u-fuzz"
	f.Add("gpu", "Foo", "v", "Bad", "In", "", "zone", "High", uint8(0xff), int32(0))
	f.Add("", "Exists", "", "NoExecute", "Gt", "1", "", "", uint8(0x55), int32(100))
	f.Add("a b", "", "a b", "", "", "x", "kubernetes.io/hostname", "high", uint8(0xaa), int32(-1))
	f.Fuzz(func(t *testing.T, key, op, value, effect, nodeOp, nodeValue, topology, priority string, flags uint8, weight int32) {
		rc := base.DeepCopy()
		rc.Labels = map[string]string{LabelPriorityClass: priority}
		spec := &rc.Spec.WorkerGroupSpecs[0].Template.Spec
		if flags&1 != 0 {
			tol := corev1.Toleration{Key: key, Operator: corev1.TolerationOperator(op), Value: value, Effect: corev1.TaintEffect(effect)}
			if flags&2 != 0 {
				tol.TolerationSeconds = ptr.To(int64(weight))
			}
			spec.Tolerations = []corev1.Toleration{tol}
		}
		if flags&4 != 0 {
			a := &corev1.Affinity{}
			if flags&8 != 0 {
				a.NodeAffinity = &corev1.NodeAffinity{}
				req := corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOperator(nodeOp)}
				if nodeValue != "" {
					req.Values = []string{nodeValue}
				}
				if flags&16 != 0 {
					a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
					if flags&32 != 0 {
						a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms = []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req}},
							{MatchFields: []corev1.NodeSelectorRequirement{req}}}
					}
				}
				a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.PreferredSchedulingTerm{{Weight: weight}}
			}
			if flags&64 != 0 {
				term := corev1.PodAffinityTerm{TopologyKey: topology, Namespaces: []string{value}}
				if flags&128 != 0 {
					term.LabelSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: metav1.LabelSelectorOperator(op)}}}
					term.NamespaceSelector = &metav1.LabelSelector{}
				}
				a.PodAffinity = &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term}}
				a.PodAntiAffinity = &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: weight, PodAffinityTerm: term}}}
			}
			spec.Affinity = a
		}
		rc = normalized(rc)
		sched := "none"
		if flags&2 != 0 {
			sched = "volcano"
		}
		if validateCluster(rc, sched) == nil {
			return
		}
		d := decide(context.Background(), rc, observed{volcano: true, now: time.Now()}, sched)
		if len(d.create) != 0 || len(d.children) != 0 || d.podGroup != nil {
			t.Fatalf("a refused cluster makes %d pods, %d children, PodGroup %v", len(d.create), len(d.children), d.podGroup)
		}
	})
}
