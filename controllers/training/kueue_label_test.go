package training

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/testenv"
)

// installWorkloadCRD installs a schemaless stand-in for Kueue's Workload
// CRD (v1beta2 with a status subresource): enough for Loom to write and
// watch a job's Workload, with no Kueue to admit it. (The e2e tier runs the
// real Kueue.)
func installWorkloadCRD(t *testing.T) {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: kueue.WorkloadCRD},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: kueue.Group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "workloads", Singular: "workload", Kind: "Workload", ListKind: "WorkloadList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1beta2", Served: true, Storage: true,
				Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr(true)}},
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}}},
		},
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion("apiextensions.k8s.io/v1")
	u.SetKind("CustomResourceDefinition")
	ctx := context.Background()
	if err := testenv.Apply(ctx, env.Config, env.Client, []*unstructured.Unstructured{u}); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitForCRDs(ctx, env.Config, kueue.WorkloadCRD); err != nil {
		t.Fatal(err)
	}
}

// A job waiting for Kueue whose queue label is removed runs as any other,
// and its Workload goes; one whose label names another LocalQueue has its
// Workload replaced in that queue. Label edits leave the generation as it
// was, and nothing else wakes the job here: the controller must see them.
func TestKueueLabelEdits(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-label")
	startManager(t)
	ctx := context.Background()
	workload := func(job *trainingv1alpha1.TrainingJob) (*unstructured.Unstructured, error) {
		wl := &unstructured.Unstructured{}
		wl.SetGroupVersionKind(kueue.WorkloadGVK)
		got := getJob(t, job)
		return wl, env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kueue.WorkloadName(got.Name, got.UID, trainingJobGVK)}, wl)
	}
	label := func(job *trainingv1alpha1.TrainingJob, value string) {
		got := getJob(t, job)
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, kueue.QueueLabel, value)
		if err := env.Client.Patch(ctx, got, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
		if g := getJob(t, job).Generation; g != got.Generation {
			t.Fatalf("test premise: the label edit moved the generation %d -> %d", got.Generation, g)
		}
	}
	var jobs []*trainingv1alpha1.TrainingJob
	for _, name := range []string{"unqueued", "moved"} {
		job := newJob(ns, name, 1, 0, trainingv1alpha1.GangNone)
		job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
		create(t, job)
		waitState(t, job, trainingv1alpha1.StateSuspended)
		testenv.Eventually(t, 20*time.Second, func() error { _, err := workload(job); return err })
		jobs = append(jobs, job)
	}
	time.Sleep(2 * time.Second) // the passes of the creates are over

	label(jobs[0], "null")
	testenv.Eventually(t, 20*time.Second, func() error {
		if n := len(jobPods(t, jobs[0])); n != 2 {
			got := getJob(t, jobs[0])
			return fmt.Errorf("label removed: %d pods, state %s", n, got.Status.State)
		}
		if _, err := workload(jobs[0]); !apierrors.IsNotFound(err) {
			return fmt.Errorf("label removed, the Workload is still there (%v)", err)
		}
		return nil
	})

	label(jobs[1], `"team-b"`)
	testenv.Eventually(t, 20*time.Second, func() error {
		wl, err := workload(jobs[1])
		if err != nil {
			return err
		}
		if q, _, _ := unstructured.NestedString(wl.Object, "spec", "queueName"); q != "team-b" {
			return fmt.Errorf("the job moved to LocalQueue team-b, its Workload still in %q", q)
		}
		return nil
	})
	if n := len(jobPods(t, jobs[1])); n != 0 {
		t.Fatalf("the moved job, still waiting for Kueue, has %d pods", n)
	}
}
