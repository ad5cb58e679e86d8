package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/testenv"
	"github.com/loom-dev/loom/internal/why"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	if os.Getenv("KUBECTL_LOOM_MAIN") == "1" {
		// The child of TestMainExitsOneOnError: main, no API server.
		os.Args = []string{"kubectl-loom", "why", "pod/x"}
		main()
		os.Exit(0)
	}
	testenv.Main(m, &env)
}

// kubeconfig writes a kubeconfig for the test API server.
func kubeconfig(t *testing.T) string {
	t.Helper()
	return kubeconfigFor(t, env.Config)
}

// kubeconfigFor writes a kubeconfig for the API server of cfg.
func kubeconfigFor(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin", Namespace: "default"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// run runs kubectl loom with args against the test API server.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append([]string{"--kubeconfig", kubeconfig(t)}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestWhyPendingTrainingJob(t *testing.T) {
	ctx := context.Background()
	if err := env.CreateNamespace(ctx, "why"); err != nil {
		t.Fatal(err)
	}
	tj := &trainingv1alpha1.TrainingJob{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "why"}}
	tj.Spec.ReplicaSpecs.Master = trainingv1alpha1.ReplicaSpec{Replicas: ptr.To[int32](1), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "train", Image: "pytorch", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("16")}}}}}}}
	if err := env.Client.Create(ctx, tj); err != nil {
		t.Fatal(err)
	}
	msg := "0 of 1 pods placed; inventory: needs 1 pod × 16 nvidia.com/gpu (16 in all); this cluster has 2 nodes with 16 GPUs, none with more than 8: a pod is bigger than any node it may go to, it can never fit"
	now := metav1.NewTime(time.Now())
	tj.Status.State, tj.Status.ObservedGeneration = trainingv1alpha1.StatePending, tj.Generation
	tj.Status.Conditions = []metav1.Condition{
		{Type: trainingv1alpha1.ConditionCreated, Status: metav1.ConditionTrue, Reason: "Created", Message: "created", LastTransitionTime: now},
		{Type: trainingv1alpha1.ConditionScheduled, Status: metav1.ConditionFalse, Reason: why.ReasonNeverFits, Message: msg, LastTransitionTime: now},
		{Type: trainingv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: why.ReasonNeverFits, Message: msg, LastTransitionTime: now},
	}
	if err := env.Client.Status().Update(ctx, tj); err != nil {
		t.Fatal(err)
	}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "big.1", Namespace: "why"}, Type: corev1.EventTypeWarning, Reason: why.ReasonNeverFits,
		Message: "needs 16 GPUs per pod", LastTimestamp: now, Count: 2,
		InvolvedObject: corev1.ObjectReference{Kind: "TrainingJob", APIVersion: trainingv1alpha1.GroupVersion.String(), Namespace: "why", Name: "big", UID: tj.UID}}
	if err := env.Client.Create(ctx, ev); err != nil {
		t.Fatal(err)
	}

	out, err := run(t, "why", "tj/big", "-n", "why")
	if err != nil {
		t.Fatalf("why: %v", err)
	}
	lines := strings.Split(out, "\n")
	if want := "trainingjob/big: Pending (NeverFits): " + msg; lines[0] != want {
		t.Errorf("first line\n got %q\nwant %q", lines[0], want)
	}
	if want := "What to do: reduce replicas or GPUs per pod (now 16 nvidia.com/gpu), or add nodes with more nvidia.com/gpu per node"; lines[1] != want {
		t.Errorf("advice\n got %q\nwant %q", lines[1], want)
	}
	if !strings.Contains(out, "Warning events:\n  ") || !strings.Contains(out, "NeverFits (x2): needs 16 GPUs per pod") {
		t.Errorf("no Warning event in\n%s", out)
	}
	js, err := run(t, "why", "trainingjob", "big", "-n", "why", "-o", "json")
	if err != nil || !strings.Contains(js, `"reason": "NeverFits"`) {
		t.Errorf("-o json: %v\n%s", err, js)
	}
	if _, err := run(t, "why", "tj/absent", "-n", "why"); err == nil || !strings.Contains(err.Error(), `not found in namespace "why"`) {
		t.Errorf("a missing job: err = %v, want not found", err)
	}
	if _, err := run(t, "why", "pod/big"); err == nil || !strings.Contains(err.Error(), "does not explain") {
		t.Errorf("an unknown kind: err = %v", err)
	}
	if _, err := run(t, "why", "tj/big", "-o", "table"); err == nil {
		t.Error("-o table: no error")
	}
}

func TestGPUsAndUpgrades(t *testing.T) {
	ctx := context.Background()
	if err := env.CreateNamespace(ctx, "fleet"); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true",
		gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3", gpuv1alpha1.LabelUpgradeState: gpuv1alpha1.UpgradeFailed},
		Annotations: map[string]string{gpuv1alpha1.AnnotationClaim: "default", gpuv1alpha1.AnnotationFailure: "driver pod not ready"}},
		Spec: corev1.NodeSpec{Unschedulable: true}}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	node.Status.Capacity = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8"), corev1.ResourcePods: resource.MustParse("110")}
	node.Status.Allocatable = node.Status.Capacity
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}} // as its kubelet posts it
	if err := env.Client.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fleet"}, Spec: corev1.PodSpec{NodeName: "gpu-1",
			Containers: []corev1.Container{{Name: "c", Image: "x", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("3")}}}}}}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}

	out, err := run(t, "gpus", "-o", "wide")
	if err != nil {
		t.Fatalf("gpus: %v", err)
	}
	row := strings.Fields(lastLine(out, "gpu-1"))
	if want := []string{"gpu-1", "NVIDIA-H100-80GB-HBM3", "0", "0", "nvidia.com/gpu", "8", "6", "2", "-", "false", "fleet/a=3,fleet/b=3"}; strings.Join(row, " ") != strings.Join(want, " ") {
		t.Errorf("gpus row\n got %q\nwant %q\n%s", row, want, out)
	}
	// No Loom manager runs here: the GPU node is shown, with a warning.
	if _, errOut, err := runOn(t, kubeconfig(t), "gpus"); err != nil || !strings.HasPrefix(errOut, "Warning: no Loom manager is installed") {
		t.Errorf("gpus without a manager: err %v, stderr %q", err, errOut)
	}
	out, err = run(t, "upgrades")
	if err != nil {
		t.Fatalf("upgrades: %v", err)
	}
	if !strings.HasPrefix(out, "no ClusterPolicy in force") || !strings.Contains(lastLine(out, "gpu-1"), "upgrade-failed   default   true") ||
		!strings.Contains(out, "driver pod not ready") {
		t.Errorf("upgrades:\n%s", out)
	}
	out, err = run(t, "why", "node/gpu-1")
	if err != nil || !strings.HasPrefix(out, "node/gpu-1: UpgradeFailed (UpgradeFailed): driver upgrade failed: driver pod not ready\n") {
		t.Errorf("why node: %v\n%s", err, out)
	}
}

func lastLine(out, prefix string) string {
	var found string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			found = l
		}
	}
	return found
}

// TestMainExitsOneOnError runs main in a child process: bad arguments
// print "error: ..." to stderr, nothing to stdout, and exit 1.
func TestMainExitsOneOnError(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestMainExitsOneOnError$")
	cmd.Env = append(os.Environ(), "KUBECTL_LOOM_MAIN=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1; stderr: %s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), `error: kubectl loom why does not explain "pod"`) || strings.Contains(stdout.String(), "error:") {
		t.Errorf("stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

// An object that cannot be read says why in terms of what to do: the kind's
// CRD is not served (Loom or KubeRay's CRD is not installed), or the object
// is not in the namespace looked in.
func TestExplainGet(t *testing.T) {
	noMatch := func(group, kind string) error {
		return &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: group, Kind: kind}, SearchedVersions: []string{"v1"}}
	}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "training.loom.dev", Resource: "trainingjobs"}, "bert", errors.New("no rights"))
	cases := []struct {
		name       string
		err        error
		kind, want string
	}{
		{"no Loom", noMatch("training.loom.dev", "TrainingJob"), "TrainingJob", "does not serve Loom's TrainingJob CRD: is Loom installed?"},
		{"no policy CRD", noMatch("gpu.loom.dev", "ClusterPolicy"), "ClusterPolicy", "does not serve Loom's ClusterPolicy CRD"},
		{"no Ray CRD", noMatch("ray.io", "RayCluster"), "RayCluster", "does not serve KubeRay's RayCluster CRD"},
		{"another namespace", apierrors.NewNotFound(schema.GroupResource{Group: "training.loom.dev", Resource: "trainingjobs"}, "bert"), "TrainingJob",
			`trainingjob "bert" not found in namespace "ml" (another namespace: -n <namespace>)`},
		{"a node", apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "bert"), "Node", `nodes "bert" not found`},
		{"forbidden as it is", forbidden, "TrainingJob", forbidden.Error()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := explainGet(tc.err, tc.kind, "bert", "ml").Error(); !strings.Contains(got, tc.want) {
				t.Errorf("got  %q\nwant it to hold %q", got, tc.want)
			}
		})
	}
}

// A RayJob waiting on a cluster that can never fit: why names the reason
// and sends the user to the cluster's own answer.
func TestWhyRayJob(t *testing.T) {
	ctx := context.Background()
	if err := env.CreateNamespace(ctx, "ray"); err != nil {
		t.Fatal(err)
	}
	job := &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "tune", Namespace: "ray"}, Spec: rayv1.RayJobSpec{Entrypoint: "python tune.py"}}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	job.Status = rayv1.RayJobStatus{JobDeploymentStatus: rayv1.JobDeploymentStatusInitializing, Reason: why.ReasonRayClusterNeverFits,
		Message: "RayCluster tune-x7k2p cannot come up: NeverFits", RayClusterName: "tune-x7k2p", ObservedGeneration: job.Generation}
	if err := env.Client.Status().Update(ctx, job); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "why", "rayjob/tune", "-n", "ray")
	if err != nil {
		t.Fatalf("why rayjob: %v", err)
	}
	if want := "rayjob/tune: Initializing (RayClusterNeverFits): RayCluster tune-x7k2p cannot come up: NeverFits\n" +
		"What to do: kubectl loom why raycluster/tune-x7k2p -n ray says why the cluster cannot come up\n"; !strings.HasPrefix(out, want) {
		t.Errorf("got\n%s\nwant it to start with\n%s", out, want)
	}
}
