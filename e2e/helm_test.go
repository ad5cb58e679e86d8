package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
	"github.com/loom-dev/loom/internal/testenv"
)

const (
	helmRel = "loom-upgrade"
	helmNS  = "loom-upgrade"
	helmJob = "ml-helm"
)

var loomCRDs = []string{"clusterpolicies.gpu.loom.dev", "gpunodes.gpu.loom.dev", "trainingjobs.training.loom.dev"}

// olderChart is charts/loom as an older release shipped it: its
// TrainingJob CRD without spec.failurePolicy.
func olderChart(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "loom")
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "charts", "loom"), dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "crds", "training.loom.dev_trainingjobs.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(b, &u.Object); err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
	v0, _ := versions[0].(map[string]any)
	unstructured.RemoveNestedField(v0, "schema", "openAPIV3Schema", "properties", "spec", "properties", "failurePolicy")
	if err := unstructured.SetNestedSlice(u.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	if b, err = yaml.Marshal(u.Object); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// deleteLoomCRDs removes Loom's CRDs so that helm installs the older
// chart's (Helm never replaces a CRD that exists).
func deleteLoomCRDs(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, name := range loomCRDs {
		crd := crdMeta(name)
		if err := cluster.Client.Delete(ctx, crd); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, func() (bool, string) {
			return apierrors.IsNotFound(cluster.Client.Get(ctx, client.ObjectKey{Name: name}, crdMeta(name))), name + " still there"
		})
	}
}

func crdMeta(name string) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(schemaGVK("apiextensions.k8s.io", "v1", "CustomResourceDefinition"))
	m.SetName(name)
	return m
}

func hasFailurePolicy(t *testing.T, ctx context.Context) bool {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schemaGVK("apiextensions.k8s.io", "v1", "CustomResourceDefinition"))
	if err := cluster.Client.Get(ctx, client.ObjectKey{Name: "trainingjobs.training.loom.dev"}, u); err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
	v0, _ := versions[0].(map[string]any)
	_, ok, _ := unstructured.NestedMap(v0, "schema", "openAPIV3Schema", "properties", "spec", "properties", "failurePolicy")
	return ok
}

// roundTrip creates a TrainingJob with spec.failurePolicy and reads it
// back: whether the field survived.
func roundTrip(t *testing.T, ctx context.Context, name string) bool {
	t.Helper()
	job := simJob(helmJob, name, 1, nil, nil)
	job.Spec.RunPolicy.Suspend = true
	job.Spec.FailurePolicy.RetryableExitCodes = []trainingv1alpha1.ExitCodeRange{{Min: 137}}
	if err := cluster.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	got := &trainingv1alpha1.TrainingJob{}
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(job), got); err != nil {
		t.Fatal(err)
	}
	_ = cluster.Client.Delete(ctx, got)
	return len(got.Spec.FailurePolicy.RetryableExitCodes) == 1 && got.Spec.FailurePolicy.RetryableExitCodes[0].Min == 137
}

func helmInstall(t *testing.T, ctx context.Context, chart string) {
	t.Helper()
	if _, err := cluster.RunHelm(ctx, "upgrade", "--install", helmRel, chart, "--namespace", helmNS, "--create-namespace",
		"--kubeconfig", cluster.Kubeconfig, "--wait", "--timeout", "3m", "--set", "uninstall.cleanup=true"); err != nil {
		t.Fatal(err)
	}
}

func startManager(t *testing.T, ctx context.Context, rel *framework.Release, args ...string) *framework.Manager {
	t.Helper()
	m, err := cluster.RunManager(ctx, loomBin, rel, append([]string{"--gang-scheduler=none"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop(20 * time.Second) })
	if err := cluster.WaitReady(ctx, m, helmNS, "loom-manager", 90*time.Second); err != nil {
		t.Fatal(err)
	}
	return m
}

// An older chart installed, upgraded to this one (helm leaves crds/ alone;
// the new manager brings its CRDs up to date, so a new field survives),
// then uninstalled with the cleanup hook: nothing of Loom's is left but
// its CRDs.
func TestHelmUpgradeAndUninstall(t *testing.T) {
	ctx := context.Background()
	testNodes(t, framework.NodeSpec{Prefix: "helm-cpu", Count: 2})
	testNodes(t, framework.NodeSpec{Prefix: "helm-h100", Count: 1, GPUs: 8, Product: "NVIDIA-H100-80GB-HBM3",
		Labels: map[string]string{"team": "ml"}})
	must(t, cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: helmJob}}))
	// One Loom per cluster: the other tests' release (its admission policy
	// admits only its own node agents) goes first; they install it again.
	if _, err := cluster.RunHelm(ctx, "uninstall", "loom", "--namespace", loomNS, "--ignore-not-found",
		"--kubeconfig", cluster.Kubeconfig, "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	// A failed run must not leave this release's policy behind either.
	t.Cleanup(func() {
		_, _ = cluster.RunHelm(context.Background(), "uninstall", helmRel, "--namespace", helmNS, "--ignore-not-found",
			"--kubeconfig", cluster.Kubeconfig, "--wait", "--timeout", "2m")
	})
	deleteLoomCRDs(t, ctx)

	// The older release, with its manager (which did not apply CRDs).
	helmInstall(t, ctx, olderChart(t))
	rel := &framework.Release{Name: helmRel, Namespace: helmNS, ServiceAccount: helmRel + "-manager"}
	old := startManager(t, ctx, rel, "--apply-crds=false")
	if hasFailurePolicy(t, ctx) || roundTrip(t, ctx, "before-upgrade") {
		t.Fatal("setup: the older chart's CRD kept spec.failurePolicy")
	}
	old.Stop(20 * time.Second)

	// helm upgrade leaves crds/ as they were; the new manager applies its own.
	root, _ := testenv.RepoRoot()
	helmInstall(t, ctx, filepath.Join(root, "charts", "loom"))
	if hasFailurePolicy(t, ctx) {
		t.Fatal("helm upgrade changed the CRD: this test no longer tests the manager")
	}
	m := startManager(t, ctx, rel)
	if !hasFailurePolicy(t, ctx) || !roundTrip(t, ctx, "after-upgrade") {
		t.Fatalf("after the new manager started, spec.failurePolicy is still pruned:\n%s", m.Tail(3000))
	}

	checkAggregatedRoles(t, ctx)

	// A GPU node with its agent, labels and a ClusterPolicy's operands.
	agent := runAgent(t, rel, framework.AgentSpec{Node: "helm-h100-0", System: "dgx-h100"})
	eventually(t, 60*time.Second, wantLabels("helm-h100-0", map[string]string{gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3"}))
	must(t, cluster.Client.Create(ctx, &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "helm-default"}}))
	eventually(t, 60*time.Second, func() (bool, string) {
		list := &appsv1.DaemonSetList{}
		_ = cluster.Client.List(ctx, list, client.InNamespace(helmNS), client.MatchingLabels{"app.kubernetes.io/managed-by": "loom"})
		return len(list.Items) > 0, "no operand DaemonSets yet"
	})

	runCleanupHook(t, ctx, m, agent)
	if out, err := cluster.RunHelm(ctx, "uninstall", helmRel, "--namespace", helmNS, "--kubeconfig", cluster.Kubeconfig, "--wait", "--timeout", "2m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	checkNothingLeft(t, ctx)
}

// runCleanupHook runs `loom uninstall-cleanup` as the hook Job would: with
// the hook's own rendered RBAC and the Job's arguments, while the manager
// runs. kwok runs no containers, so the chart's Deployment and DaemonSet
// pods are stand-ins: when the cleanup deletes them, the local manager and
// agent they stand for are stopped.
func runCleanupHook(t *testing.T, ctx context.Context, m *framework.Manager, agent *framework.Process) {
	t.Helper()
	root, _ := testenv.RepoRoot()
	out, err := cluster.RunHelm(ctx, "template", helmRel, filepath.Join(root, "charts", "loom"), "--namespace", helmNS,
		"--kube-version", "1.37.2", "--set", "uninstall.cleanup=true", "--show-only", "templates/uninstall-cleanup.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rbac []string
	var args []string
	for _, doc := range strings.Split(out, "\n---") {
		if strings.Contains(doc, "kind: Job") {
			u := &unstructured.Unstructured{}
			must(t, yaml.Unmarshal([]byte(doc), &u.Object))
			cs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			c0, _ := cs[0].(map[string]any)
			args, _, _ = unstructured.NestedStringSlice(c0, "args")
			continue
		}
		rbac = append(rbac, doc)
	}
	rbacFile := filepath.Join(t.TempDir(), "hook-rbac.yaml")
	must(t, os.WriteFile(rbacFile, []byte(strings.Join(rbac, "\n---")), 0o644))
	kubectl := func(a ...string) {
		if out, err := exec.CommandContext(ctx, cluster.Kubectl(), append([]string{"--kubeconfig", cluster.Kubeconfig}, a...)...).CombinedOutput(); err != nil {
			t.Fatalf("kubectl %v: %v\n%s", a, err, out)
		}
	}
	kubectl("apply", "-f", rbacFile)
	defer kubectl("delete", "-f", rbacFile, "--ignore-not-found")
	hookRel := &framework.Release{Name: helmRel, Namespace: helmNS, ServiceAccount: helmRel + "-uninstall-cleanup"}
	kubeconfig := serviceAccountKubeconfig(t, ctx, hookRel)

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the pods going away, played by the local processes
		defer close(done)
		managerUp, agentUp := true, true
		for managerUp || agentUp {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if managerUp && apierrors.IsNotFound(cluster.Client.Get(ctx, client.ObjectKey{Namespace: helmNS, Name: helmRel + "-manager"}, &appsv1.Deployment{})) {
				m.Stop(20 * time.Second)
				managerUp = false
			}
			if agentUp && apierrors.IsNotFound(cluster.Client.Get(ctx, client.ObjectKey{Namespace: helmNS, Name: helmRel + "-node-agent"}, &appsv1.DaemonSet{})) {
				agent.Stop(10 * time.Second)
				agentUp = false
			}
		}
	}()
	cmd := exec.CommandContext(ctx, loomBin, append(args, "--kubeconfig", kubeconfig, "--timeout", "90s")...)
	outb, err := cmd.CombinedOutput()
	close(stop)
	<-done
	if err != nil {
		t.Fatalf("loom %v: %v\n%s\nmanager:\n%s", args, err, outb, m.Tail(3000))
	}
	t.Logf("loom uninstall-cleanup:\n%s", outb)
}

func serviceAccountKubeconfig(t *testing.T, ctx context.Context, rel *framework.Release) string {
	t.Helper()
	tr, err := cluster.Clientset.CoreV1().ServiceAccounts(rel.Namespace).CreateToken(ctx, rel.ServiceAccount, tokenRequest(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), rel.ServiceAccount+".kubeconfig")
	must(t, framework.WriteKubeconfig(path, cluster.Server, cluster.CAFile, tr.Status.Token, "system:serviceaccount:"+rel.Namespace+":"+rel.ServiceAccount))
	return path
}

// checkAggregatedRoles: Kubernetes' own view and edit, through the
// aggregation controller, cover Loom's kinds.
func checkAggregatedRoles(t *testing.T, ctx context.Context) {
	t.Helper()
	must(t, cluster.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: helmJob, Name: "alice-edit"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "alice"}}}))
	must(t, cluster.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "helm-test-bob-view"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "bob"}}}))
	t.Cleanup(func() {
		_ = cluster.Client.Delete(context.Background(), &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "helm-test-bob-view"}})
	})
	for _, c := range []struct {
		user, verb, resource, ns, want string
	}{
		{"alice", "create", "trainingjobs.training.loom.dev", helmJob, "yes"},
		{"alice", "delete", "trainingjobs.training.loom.dev", helmJob, "yes"},
		{"alice", "create", "trainingjobs.training.loom.dev", "default", "no"},
		{"bob", "list", "gpunodes.gpu.loom.dev", "", "yes"},
		{"bob", "watch", "clusterpolicies.gpu.loom.dev", "", "yes"},
		{"bob", "get", "trainingjobs.training.loom.dev", helmJob, "yes"},
		{"bob", "create", "trainingjobs.training.loom.dev", helmJob, "no"},
		{"bob", "delete", "clusterpolicies.gpu.loom.dev", "", "no"},
	} {
		args := []string{"--kubeconfig", cluster.Kubeconfig, "auth", "can-i", c.verb, c.resource, "--as", c.user}
		if c.ns != "" {
			args = append(args, "-n", c.ns)
		}
		eventually(t, 30*time.Second, func() (bool, string) {
			out, _ := exec.CommandContext(ctx, cluster.Kubectl(), args...).Output() // exit 1 means "no"
			got := strings.TrimSpace(string(out))
			return got == c.want, fmt.Sprintf("kubectl auth can-i %s %s --as %s -n %q: %q, want %q", c.verb, c.resource, c.user, c.ns, got, c.want)
		})
	}
}

// checkNothingLeft: after the hook and helm uninstall only Loom's CRDs
// (and the namespace helm created) remain.
func checkNothingLeft(t *testing.T, ctx context.Context) {
	t.Helper()
	eventually(t, 60*time.Second, func() (bool, string) {
		var left []string
		count := func(what string, list client.ObjectList, opts ...client.ListOption) {
			if err := cluster.Client.List(ctx, list, opts...); err != nil {
				left = append(left, what+": "+err.Error())
				return
			}
			if n := len(mustItems(list)); n > 0 {
				left = append(left, fmt.Sprintf("%d %s", n, what))
			}
		}
		count("ClusterPolicies", &gpuv1alpha1.ClusterPolicyList{})
		count("GPUNodes", &gpuv1alpha1.GPUNodeList{})
		count("DaemonSets", &appsv1.DaemonSetList{}, client.InNamespace(helmNS))
		count("Deployments", &appsv1.DeploymentList{}, client.InNamespace(helmNS))
		count("ServiceAccounts of the release", &corev1.ServiceAccountList{}, client.InNamespace(helmNS), client.MatchingLabels{"app.kubernetes.io/instance": helmRel})
		count("ClusterRoles of the release", &rbacv1.ClusterRoleList{}, client.MatchingLabels{"app.kubernetes.io/instance": helmRel})
		// The simulated cluster has its own nvidia RuntimeClass (as a
		// toolkit installed without Loom would); only Loom's must go.
		rc := &nodev1.RuntimeClass{}
		if err := cluster.Client.Get(ctx, client.ObjectKey{Name: "nvidia"}, rc); err == nil && rc.Labels["app.kubernetes.io/managed-by"] == "loom" {
			left = append(left, "Loom's RuntimeClass nvidia")
		}
		n := &corev1.Node{}
		if err := cluster.Client.Get(ctx, client.ObjectKey{Name: "helm-h100-0"}, n); err != nil {
			left = append(left, err.Error())
		}
		for k := range n.Labels {
			if strings.HasPrefix(k, gpuv1alpha1.LabelPrefix) && k != "nvidia.com/gpu.deploy.operands" {
				left = append(left, "node label "+k)
			}
		}
		if slices.ContainsFunc(n.ManagedFields, func(f metav1.ManagedFieldsEntry) bool { return f.Manager == "loom-gpu-labels" }) {
			left = append(left, "fields of loom-gpu-labels on the node")
		}
		if n.Spec.Unschedulable || n.Labels["team"] != "ml" {
			left = append(left, "node cordoned or its own label gone")
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
	for _, name := range loomCRDs {
		if err := cluster.Client.Get(ctx, client.ObjectKey{Name: name}, crdMeta(name)); err != nil {
			t.Errorf("CRD %s should stay after uninstall: %v", name, err)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func tokenRequest() *authenticationv1.TokenRequest {
	return &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
}

func mustItems(list client.ObjectList) []runtime.Object {
	items, _ := meta.ExtractList(list)
	return items
}
