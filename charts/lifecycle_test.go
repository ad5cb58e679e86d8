package charts

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

func find[T runtime.Object](objs []runtime.Object, name string) (T, bool) {
	var zero T
	for _, o := range objs {
		if t, ok := o.(T); ok {
			if m, ok := any(t).(interface{ GetName() string }); ok && (name == "" || m.GetName() == name) {
				return t, true
			}
		}
	}
	return zero, false
}

func TestNodeAgentIsSystemNodeCritical(t *testing.T) {
	ds, ok := find[*appsv1.DaemonSet](render(t), "loom-node-agent")
	if !ok {
		t.Fatal("no node agent DaemonSet")
	}
	if got := ds.Spec.Template.Spec.PriorityClassName; got != "system-node-critical" {
		t.Errorf("node agent priorityClassName %q, want system-node-critical", got)
	}
}

// The node agent tolerates Loom's unhealthy-GPU taint, as the operands
// do: it is what clears a GPU's health record and so lifts the taint, and
// an agent pod recreated on a tainted node (a helm upgrade rolls the
// DaemonSet) would otherwise never come back there.
func TestNodeAgentToleratesLoomsTaint(t *testing.T) {
	ds, ok := find[*appsv1.DaemonSet](render(t), "loom-node-agent")
	if !ok {
		t.Fatal("no node agent DaemonSet")
	}
	if !slices.ContainsFunc(ds.Spec.Template.Spec.Tolerations, func(tol corev1.Toleration) bool {
		return (tol.Key == gpuv1alpha1.TaintUnhealthy || tol.Key == "") && tol.Operator == corev1.TolerationOpExists &&
			(tol.Effect == "" || tol.Effect == corev1.TaintEffectNoSchedule)
	}) {
		t.Errorf("the node agent does not tolerate %s:NoSchedule: tolerations %+v", gpuv1alpha1.TaintUnhealthy, ds.Spec.Template.Spec.Tolerations)
	}
}

// Two replicas get a PodDisruptionBudget that keeps one; one replica none
// (a budget of one pod that must stay blocks every drain).
func TestManagerPodDisruptionBudget(t *testing.T) {
	pdb, ok := find[*policyv1.PodDisruptionBudget](render(t), "loom-manager")
	if !ok {
		t.Fatal("no PodDisruptionBudget with 2 replicas")
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 ||
		pdb.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != "manager" || pdb.Namespace != "gpu-platform" {
		t.Errorf("PodDisruptionBudget %+v", pdb.Spec)
	}
	if _, ok := find[*policyv1.PodDisruptionBudget](render(t, "manager.replicas=1"), ""); ok {
		t.Error("a PodDisruptionBudget with 1 replica")
	}
}

func rulesGrant(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

func TestAggregatedRoles(t *testing.T) {
	objs := render(t)
	view, okView := find[*rbacv1.ClusterRole](objs, "loom-view")
	edit, okEdit := find[*rbacv1.ClusterRole](objs, "loom-edit")
	if !okView || !okEdit {
		t.Fatal("no aggregated view or edit ClusterRole")
	}
	for _, agg := range []string{"view", "edit", "admin"} {
		if view.Labels["rbac.authorization.k8s.io/aggregate-to-"+agg] != "true" {
			t.Errorf("loom-view is not aggregated to %s", agg)
		}
	}
	if edit.Labels["rbac.authorization.k8s.io/aggregate-to-view"] != "" || edit.Labels["rbac.authorization.k8s.io/aggregate-to-edit"] != "true" ||
		edit.Labels["rbac.authorization.k8s.io/aggregate-to-admin"] != "true" {
		t.Errorf("loom-edit labels %v, want aggregated to edit and admin only", edit.Labels)
	}
	for _, res := range []string{"gpunodes", "clusterpolicies"} {
		if !rulesGrant(view.Rules, "gpu.loom.dev", res, "list") {
			t.Errorf("view cannot list %s", res)
		}
		for _, verb := range []string{"create", "update", "patch", "delete"} {
			if rulesGrant(view.Rules, "gpu.loom.dev", res, verb) || rulesGrant(edit.Rules, "gpu.loom.dev", res, verb) {
				t.Errorf("aggregated roles may %s %s", verb, res)
			}
		}
	}
	// Every kind a namespace user runs work with: Loom's TrainingJobs, and
	// the RayClusters and RayJobs Loom reconciles in place of KubeRay.
	for _, k := range []struct{ group, resource string }{
		{"training.loom.dev", "trainingjobs"}, {"ray.io", "rayclusters"}, {"ray.io", "rayjobs"},
	} {
		if !rulesGrant(view.Rules, k.group, k.resource, "watch") || rulesGrant(view.Rules, k.group, k.resource, "create") {
			t.Errorf("view must read %s and not write them", k.resource)
		}
		for _, verb := range []string{"create", "update", "patch", "delete"} {
			if !rulesGrant(edit.Rules, k.group, k.resource, verb) {
				t.Errorf("edit cannot %s %s", verb, k.resource)
			}
		}
	}
	if _, ok := find[*rbacv1.ClusterRole](render(t, "rbac.aggregateToDefaultRoles=false"), "loom-view"); ok {
		t.Error("rbac.aggregateToDefaultRoles=false still renders loom-view")
	}
}

// The manager may patch Loom's CRDs (and KubeRay's) by name only.
func TestManagerCRDRights(t *testing.T) {
	role, _ := find[*rbacv1.ClusterRole](render(t), "loom-manager")
	var names []string
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "customresourcedefinitions") && slices.Contains(r.Verbs, "patch") {
			names = append(names, r.ResourceNames...)
		}
	}
	slices.Sort(names)
	want := []string{"clusterpolicies.gpu.loom.dev", "gpunodes.gpu.loom.dev", "rayclusters.ray.io", "rayjobs.ray.io", "trainingjobs.training.loom.dev"}
	if !slices.Equal(names, want) {
		t.Errorf("CRD patch rights on %v, want %v", names, want)
	}
	role, _ = find[*rbacv1.ClusterRole](render(t, "manager.applyCRDs=false", "rayCluster.installCRD=false"), "loom-manager")
	for _, verb := range []string{"create", "patch", "update"} {
		if rulesGrant(role.Rules, "apiextensions.k8s.io", "customresourcedefinitions", verb) {
			t.Errorf("with applyCRDs and installCRD off the manager may still %s CRDs", verb)
		}
	}
}

// The uninstall hook is off by default; on, it is a pre-delete Job of the
// loom image running `loom uninstall-cleanup` for this release, with rights
// to exactly what it removes.
func TestUninstallCleanupHook(t *testing.T) {
	if _, ok := find[*batchv1.Job](render(t), ""); ok {
		t.Fatal("a Job rendered with uninstall.cleanup off")
	}
	objs := render(t, "uninstall.cleanup=true")
	job, ok := find[*batchv1.Job](objs, "loom-uninstall-cleanup")
	if !ok {
		t.Fatal("no cleanup Job")
	}
	if job.Annotations["helm.sh/hook"] != "pre-delete" || job.Namespace != "gpu-platform" {
		t.Errorf("Job annotations %v namespace %s", job.Annotations, job.Namespace)
	}
	c := job.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"uninstall-cleanup", "--namespace=gpu-platform", "--manager-deployment=loom-manager",
		"--node-agent-daemonset=loom-node-agent", "--leader-election-id=loom-manager"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	if !strings.HasPrefix(c.Image, "ghcr.io/loom-dev/loom:") || job.Spec.Template.Spec.ServiceAccountName != "loom-uninstall-cleanup" {
		t.Errorf("image %s, service account %s", c.Image, job.Spec.Template.Spec.ServiceAccountName)
	}
	role, ok := find[*rbacv1.ClusterRole](objs, "loom-uninstall-cleanup")
	if !ok {
		t.Fatal("no cleanup ClusterRole")
	}
	for _, grant := range [][3]string{{"gpu.loom.dev", "clusterpolicies", "delete"}, {"gpu.loom.dev", "gpunodes", "delete"}, {"", "nodes", "patch"}} {
		if !rulesGrant(role.Rules, grant[0], grant[1], grant[2]) {
			t.Errorf("cleanup ClusterRole cannot %s %s", grant[2], grant[1])
		}
	}
	// The rayjob controller's stop-job finalizers go with it; with the
	// controller off, KubeRay's RayJobs are not Loom's to touch.
	if !strings.Contains(args, "--rayjob-finalizers") || !rulesGrant(role.Rules, "ray.io", "rayjobs", "patch") {
		t.Errorf("with the rayjob controller on, the hook leaves RayJob finalizers: args %q", args)
	}
	off := render(t, "uninstall.cleanup=true", "manager.controllers=trainingjob\\,raycluster")
	offJob, _ := find[*batchv1.Job](off, "loom-uninstall-cleanup")
	offRole, _ := find[*rbacv1.ClusterRole](off, "loom-uninstall-cleanup")
	if slices.Contains(offJob.Spec.Template.Spec.Containers[0].Args, "--rayjob-finalizers") || rulesGrant(offRole.Rules, "ray.io", "rayjobs", "patch") {
		t.Error("with the rayjob controller off, the hook still removes RayJob finalizers")
	}
	for _, r := range role.Rules {
		if slices.Contains(r.Verbs, "create") || slices.Contains(r.Verbs, "update") {
			t.Errorf("cleanup ClusterRole creates or updates: %+v", r)
		}
		if hook := role.Annotations["helm.sh/hook"]; hook != "pre-delete" {
			t.Errorf("cleanup ClusterRole hook %q", hook)
		}
	}
}

// Values that render a manager that cannot work are refused at install,
// with a message naming the values: two replicas without leader election
// would both reconcile (two driver upgrades cordoning nodes, two writers
// racing on every pod and status), and a metrics port on the probes' port
// would never bind; a pod label that replaces one the Deployment selects
// its pods by would be refused by the API server with a message that
// names neither.
func TestChartRefusesUnsafeCombinations(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"manager.leaderElection.enabled=false"}, "manager.leaderElection.enabled=false needs manager.replicas <= 1"},
		{[]string{"metrics.port=8081"}, "metrics.port 8081 is the manager's health probe port"},
		{[]string{"manager.podLabels.app\\.kubernetes\\.io/name=gpu"}, "manager.podLabels may not set app.kubernetes.io/name: the manager's Deployment selects"},
		{[]string{"manager.podLabels.app\\.kubernetes\\.io/component=ctl"}, "manager.podLabels may not set app.kubernetes.io/component"},
		{[]string{"serviceAccount.create=false", "serviceAccount.name=mine", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn"},
			"serviceAccount.annotations are set on the ServiceAccount the chart creates"},
	} {
		args := []string{"template", "loom", chartDir(), "--kube-version", "1.37.2"}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("--set %v: err %v, want a failure saying %q:\n%.300s", tc.set, err, tc.want, out)
		}
	}
	if _, ok := find[*appsv1.Deployment](render(t, "manager.podLabels.team=ml"), "loom-manager"); !ok {
		t.Error("a pod label of the user's own does not render")
	}
	// One replica without leader election is fine.
	if _, ok := find[*appsv1.Deployment](render(t, "manager.leaderElection.enabled=false", "manager.replicas=1"), "loom-manager"); !ok {
		t.Error("one replica without leader election does not render")
	}
}

// The node agent runs where NFD saw an NVIDIA PCI device or Loom labelled
// the node; without NFD, nodeAgent.affinity replaces those terms (a GPU
// node pool's label, say), while nodeAgent.nodeSelector narrows them.
func TestNodeAgentPlacement(t *testing.T) {
	terms := func(objs []runtime.Object) []corev1.NodeSelectorTerm {
		ds, ok := find[*appsv1.DaemonSet](objs, "loom-node-agent")
		if !ok {
			t.Fatal("no node agent DaemonSet")
		}
		a := ds.Spec.Template.Spec.Affinity
		if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
			t.Fatalf("node agent affinity %+v", a)
		}
		return a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	}
	if got := terms(render(t)); len(got) != 4 || got[0].MatchExpressions[0].Key != "feature.node.kubernetes.io/pci-10de.present" {
		t.Errorf("default node agent terms %+v", got)
	}
	pool := "nodeAgent.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]."
	got := terms(render(t, pool+"key=cloud.google.com/gke-accelerator", pool+"operator=Exists"))
	if len(got) != 1 || got[0].MatchExpressions[0].Key != "cloud.google.com/gke-accelerator" {
		t.Errorf("nodeAgent.affinity: terms %+v, want the pool's only", got)
	}
}
