package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/controllers/rayjob"
	"github.com/loom-dev/loom/controllers/rayjob/rayfake"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// The tests below play the parts of the cluster's other actors (kubelet,
// DaemonSet controller, Kueue, a Ray job's submitter) through the API, so
// that the manager's later write paths run under the chart's rules too.

// olderCRDs makes EnsureCRDs write each of Loom's CRDs: one carries an
// older release's annotations (patched), one is deleted (created), the
// other has none (patched, as installed by hand).
func olderCRDs(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	old := fmt.Sprintf(`{"metadata":{"annotations":{%q:"v0.0.1",%q:"older"}}}`, manager.AnnotationCRDVersion, manager.AnnotationCRDHash)
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "clusterpolicies.gpu.loom.dev"}}
	must(t, c.Patch(ctx, crd, client.RawPatch(types.MergePatchType, []byte(old))))
	gone := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "trainingjobs.training.loom.dev"}}
	must(t, c.Delete(ctx, gone))
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(gone), gone); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the TrainingJob CRD is not gone yet (%v)", err)
		}
		return nil
	})
}

// crdsApplied checks that EnsureCRDs applied this build to each of Loom's
// CRDs.
func crdsApplied(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	for _, name := range []string{"clusterpolicies.gpu.loom.dev", "gpunodes.gpu.loom.dev", "trainingjobs.training.loom.dev"} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		must(t, c.Get(ctx, client.ObjectKey{Name: name}, crd))
		if a := crd.Annotations; a[manager.AnnotationCRDVersion] != manager.Version() || a[manager.AnnotationCRDHash] == "" || a[manager.AnnotationCRDHash] == "older" {
			t.Fatalf("CRD %s was not applied: annotations %v", name, a)
		}
	}
}

// installWorkloadCRD installs a schemaless stand-in for Kueue's Workload
// CRD (v1beta2, status subresource), as the training tests do: enough for
// the manager to write and watch Workloads, no Kueue to admit them.
func installWorkloadCRD(ctx context.Context, t *testing.T, env *testenv.Env) {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "workloads." + kueue.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: kueue.Group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "workloads", Singular: "workload", Kind: "Workload", ListKind: "WorkloadList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: kueue.WorkloadGVK.Version, Served: true, Storage: true,
				Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}},
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}}},
		},
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
	must(t, err)
	must(t, testenv.Apply(ctx, env.Config, env.Client, []*unstructured.Unstructured{{Object: m}}))
	must(t, testenv.WaitForCRDs(ctx, env.Config, crd.Name))
}

// queuedJob is a TrainingJob that waits for Kueue's admission.
func queuedJob() *trainingv1alpha1.TrainingJob {
	tmpl := corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "pytorch", Image: "pytorch/pytorch", Command: []string{"torchrun", "train.py"}}}}}
	return &trainingv1alpha1.TrainingJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "queued", Labels: map[string]string{kueue.QueueLabel: "team-a"}},
		Spec: trainingv1alpha1.TrainingJobSpec{
			ReplicaSpecs: trainingv1alpha1.ReplicaSpecs{Master: trainingv1alpha1.ReplicaSpec{Template: tmpl},
				Worker: &trainingv1alpha1.ReplicaSpec{Replicas: ptr.To[int32](1), Template: tmpl}},
			Gang: trainingv1alpha1.GangPolicy{Scheduler: trainingv1alpha1.GangNone},
		},
	}
}

// actors plays, one step per call, the parts of the cluster that move the
// manager's later write paths: a kubelet, the DaemonSet controller and a
// GPU workload for the driver upgrade; a kubelet and a Ray job's submitter
// for the RayJob; Kueue for a queued TrainingJob; a GPUNode left without
// its Node for the labeller to delete. step returns what is
// still to happen, empty once every path has run.
type actors struct {
	c    client.Client
	ray  *rayfake.Server
	node string
	// oldDriver is the driver template the node's driver pod first runs.
	oldDriver string
	submitted bool
	admitted  bool
	orphaned  bool
}

func (a *actors) step(ctx context.Context, t *testing.T) []string {
	t.Helper()
	var left []string
	for _, f := range []func(context.Context, *testing.T) string{a.driverUpgrade, a.rayJob, a.kueue, a.orphan} {
		if what := f(ctx, t); what != "" {
			left = append(left, what)
		}
	}
	return left
}

// driverUpgrade: the node's driver pod runs the policy's first driver
// version beside a GPU pod; the version changes, and the upgrade cordons
// the node, evicts the GPU pod and deletes the driver pod (the kubelet
// here ends what is deleted, the DaemonSet controller starts the new
// driver pod), and uncordons the node.
func (a *actors) driverUpgrade(ctx context.Context, t *testing.T) string {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := a.c.Get(ctx, client.ObjectKey{Namespace: rbacNS, Name: "loom-driver"}, ds); err != nil {
		return "the driver DaemonSet: " + err.Error()
	}
	template := ds.Spec.Template.Annotations[gpuv1alpha1.AnnotationTemplateHash]
	if a.oldDriver == "" {
		a.oldDriver = template
		a.runDriver(ctx, t, ds, template)
		gpuPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "gpu-work",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "gpu-work", UID: "gpu-work", Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: a.node, Containers: []corev1.Container{{Name: "cuda", Image: "cuda",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}}
		must(t, a.c.Create(ctx, gpuPod))
		setRunning(ctx, t, a.c, gpuPod)
		cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
		must(t, a.c.Patch(ctx, cp, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"driver":{"image":{"version":"575.57.08-ubuntu22.04"}}}}`))))
		return "the driver upgrade: started"
	}
	pods := &corev1.PodList{}
	must(t, a.c.List(ctx, pods, client.MatchingFields{"spec.nodeName": a.node}))
	driver := false
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			must(t, client.IgnoreNotFound(a.c.Delete(ctx, p, client.GracePeriodSeconds(0)))) // the kubelet ends it
			continue
		}
		driver = driver || p.Labels[gpuv1alpha1.LabelComponent] == gpuv1alpha1.OperandDriver
	}
	if !driver && template != a.oldDriver {
		a.runDriver(ctx, t, ds, template)
	}
	n := &corev1.Node{}
	must(t, a.c.Get(ctx, client.ObjectKey{Name: a.node}, n))
	if state := n.Labels[gpuv1alpha1.LabelUpgradeState]; state != gpuv1alpha1.UpgradeDone || n.Spec.Unschedulable || template == a.oldDriver {
		return fmt.Sprintf("the driver upgrade: node %s is %q, unschedulable %v", a.node, state, n.Spec.Unschedulable)
	}
	if err := a.c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: "gpu-work"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		return fmt.Sprintf("the driver upgrade: the GPU pod was not evicted (%v)", err)
	}
	return ""
}

// runDriver starts ds's pod of template on the node, as the DaemonSet
// controller and the kubelet would.
func (a *actors) runDriver(ctx context.Context, t *testing.T, ds *appsv1.DaemonSet, template string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: rbacNS, GenerateName: "loom-driver-",
		Labels:          map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver},
		Annotations:     map[string]string{gpuv1alpha1.AnnotationTemplateHash: template},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: a.node, Containers: []corev1.Container{{Name: "driver", Image: "driver"}}}}
	must(t, a.c.Create(ctx, p))
	setRunning(ctx, t, a.c, p)
}

// setRunning marks pod p running and ready, as its kubelet would.
func setRunning(ctx context.Context, t *testing.T, c client.Client, p *corev1.Pod) {
	t.Helper()
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	must(t, c.Status().Update(ctx, p))
}

// rayJob: the RayJob's cluster pods run (the raycluster controller then
// says the cluster is ready), the submitter Job submits the Ray job and
// completes, and the RayJob, done, deletes its cluster and is deleted.
func (a *actors) rayJob(ctx context.Context, t *testing.T) string {
	t.Helper()
	job := &rayv1.RayJob{}
	switch err := a.c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: "rayjob"}, job); {
	case apierrors.IsNotFound(err):
		return ""
	case err != nil:
		t.Fatal(err)
	case job.Status.RayClusterName == "":
		return "the RayJob: no cluster yet"
	case job.Status.JobDeploymentStatus == rayv1.JobDeploymentStatusComplete:
		rc := &rayv1.RayCluster{}
		if err := a.c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: job.Status.RayClusterName}, rc); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("the RayJob: complete, its cluster not deleted (%v)", err)
		}
		if job.DeletionTimestamp == nil {
			must(t, a.c.Delete(ctx, job))
		}
		return "the RayJob: being deleted"
	}
	pods := &corev1.PodList{}
	must(t, a.c.List(ctx, pods, client.InNamespace("ml"), client.MatchingLabels{"ray.io/cluster": job.Status.RayClusterName}))
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Status.Phase != corev1.PodRunning {
			p.Status.PodIP = "10.0.0.1"
			setRunning(ctx, t, a.c, p)
		}
	}
	sj := &batchv1.Job{}
	if err := a.c.Get(ctx, client.ObjectKeyFromObject(job), sj); err != nil {
		return fmt.Sprintf("the RayJob: no submitter Job (%v), deployment status %s", err, job.Status.JobDeploymentStatus)
	}
	if !a.submitted {
		_, err := a.ray.Submit(utiltypes.RayJobRequest{SubmissionId: job.Status.JobId, Entrypoint: job.Spec.Entrypoint})
		must(t, err)
		a.submitted = true
	}
	if sj.Status.CompletionTime == nil {
		now := metav1.Now()
		started := metav1.NewTime(now.Add(-time.Second))
		sj.Status.StartTime, sj.Status.CompletionTime, sj.Status.Succeeded = &started, &now, 1
		sj.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastProbeTime: now, LastTransitionTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastProbeTime: now, LastTransitionTime: now},
		}
		must(t, a.c.Status().Update(ctx, sj))
	}
	return "the RayJob: " + string(job.Status.JobDeploymentStatus)
}

// kueue: the queued TrainingJob's Workload is admitted for part of the
// gang, which the manager releases (a status patch); the job deleted,
// the manager deletes its Workload.
func (a *actors) kueue(ctx context.Context, t *testing.T) string {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(kueue.WorkloadGVK.GroupVersion().WithKind("WorkloadList"))
	must(t, a.c.List(ctx, list, client.InNamespace("ml")))
	job := queuedJob()
	jobErr := a.c.Get(ctx, client.ObjectKeyFromObject(job), job)
	switch {
	case len(list.Items) == 0 && a.admitted && apierrors.IsNotFound(jobErr):
		return ""
	case len(list.Items) == 0:
		return "the Kueue Workload: none yet"
	case !a.admitted:
		now := metav1.Now().UTC().Format(time.RFC3339)
		patch := fmt.Sprintf(`{"status":{"admission":{"clusterQueue":"cq","podSetAssignments":[{"name":"master","count":1}]},"conditions":[`+
			`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
			`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q}]}}`, now, now)
		must(t, a.c.Status().Patch(ctx, &list.Items[0], client.RawPatch(types.MergePatchType, []byte(patch))))
		a.admitted = true
		return "the Kueue Workload: admitted in part"
	}
	if _, held, _ := unstructured.NestedFieldNoCopy(list.Items[0].Object, "status", "admission"); held {
		return "the Kueue Workload: the partial admission is not released"
	}
	if jobErr == nil && job.DeletionTimestamp == nil {
		must(t, a.c.Delete(ctx, job))
	}
	return "the Kueue Workload: not deleted with its job"
}

// orphan: a GPUNode whose Node is gone, which the labeller deletes.
func (a *actors) orphan(ctx context.Context, t *testing.T) string {
	t.Helper()
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "gpu-gone"}}
	if !a.orphaned {
		must(t, a.c.Create(ctx, gn))
		a.orphaned = true
	}
	if err := a.c.Get(ctx, client.ObjectKeyFromObject(gn), gn); !apierrors.IsNotFound(err) {
		return "the GPUNode of a deleted Node: not deleted"
	}
	return ""
}

// startRayDashboard sends the manager's Ray dashboard requests to a fake
// dashboard whose jobs succeed at once.
func startRayDashboard(t *testing.T) *rayfake.Server {
	t.Helper()
	fake := rayfake.New()
	fake.PendingFor, fake.RunFor = 0, 0
	t.Cleanup(fake.Close)
	t.Setenv(rayjob.EnvDashboardOverride, fake.URL())
	return fake
}
