package training

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/testenv"
)

// installWorkloadCRD installs a stand-in for Kueue's Workload CRD (v1beta2
// with a status subresource): enough for Loom to write and watch a job's
// Workload, with no Kueue to admit it, and the checks of Kueue's schema a
// job's Workload could fail (the queue name, at most 8 pod sets); the rest
// is schemaless. (The e2e tier runs the real Kueue.)
func installWorkloadCRD(t *testing.T) { t.Helper(); installWorkloadCRDIn(t, env) }

// installWorkloadCRDIn is installWorkloadCRD on e's API server.
func installWorkloadCRDIn(t *testing.T, e *testenv.Env) {
	t.Helper()
	installKueueCRDIn(t, e, "workloads", "Workload", apiextensionsv1.NamespaceScoped, map[string]apiextensionsv1.JSONSchemaProps{
		"queueName": {Type: "string", MaxLength: ptr(int64(253)), Pattern: `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`},
		"podSets": {Type: "array", MaxItems: ptr(int64(8)), MinItems: ptr(int64(1)),
			Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr(true)}}},
	})
}

// installKueueCRD installs a Kueue CRD (status subresource included),
// schemaless but for the spec properties given, and waits until it is
// served.
func installKueueCRD(t *testing.T, plural, kind string, scope apiextensionsv1.ResourceScope, spec ...map[string]apiextensionsv1.JSONSchemaProps) {
	t.Helper()
	installKueueCRDIn(t, env, plural, kind, scope, spec...)
}

// installKueueCRDIn is installKueueCRD on e's API server.
func installKueueCRDIn(t *testing.T, e *testenv.Env, plural, kind string, scope apiextensionsv1.ResourceScope, spec ...map[string]apiextensionsv1.JSONSchemaProps) {
	t.Helper()
	schema := &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr(true)}
	if len(spec) > 0 {
		schema.Properties = map[string]apiextensionsv1.JSONSchemaProps{
			"spec": {Type: "object", XPreserveUnknownFields: ptr(true), Properties: spec[0]},
		}
	}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + kueue.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: kueue.Group, Scope: scope,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Singular: strings.ToLower(kind), Kind: kind, ListKind: kind + "List"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1beta2", Served: true, Storage: true,
				Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: schema},
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
	if err := testenv.Apply(ctx, e.Config, e.Client, []*unstructured.Unstructured{u}); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitForCRDs(ctx, e.Config, crd.Name); err != nil {
		t.Fatal(err)
	}
	// The API server's discovery follows Established by a moment, and the
	// client's mapper reloads a group version on a miss: wait until it maps
	// the kind, so the test's first create of one does not race discovery.
	gk := k8sschema.GroupKind{Group: kueue.Group, Kind: kind}
	testenv.Eventually(t, 30*time.Second, func() error {
		_, err := e.Client.RESTMapper().RESTMapping(gk, "v1beta2")
		return err
	})
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
	workload := func(job *trainingv1alpha1.TrainingJob) (*unstructured.Unstructured, error) { return workloadOf(t, job) }
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

// A Kueue-admitted job edited while suspended (more workers; bigger
// requests) must not resume under the admission of its old pod sets: that
// would run a gang Kueue never counted against the queue's quota. As
// Kueue's own jobframework does with a job no longer equivalent to its
// Workload, the gang is held, the old admission released and the Workload
// replaced by one for the job as it is now, to be admitted afresh.
func TestKueueAdmissionFollowsTheEditedPodSets(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-edit")
	startManager(t)
	ctx := context.Background()
	workload := func(job *trainingv1alpha1.TrainingJob) (*unstructured.Unstructured, error) { return workloadOf(t, job) }
	admit := func(job *trainingv1alpha1.TrainingJob) {
		wl, err := workload(job)
		if err != nil {
			t.Fatal(err)
		}
		now := metav1.Now().UTC().Format(time.RFC3339)
		patch := fmt.Sprintf(`{"status":{"admission":{"clusterQueue":"cq","podSetAssignments":[{"name":"master"},{"name":"worker"}]},"conditions":[`+
			`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
			`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q}]}}`, now, now)
		if err := env.Client.Status().Patch(ctx, wl, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	cpu := func(q string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(q)}
	}
	edits := map[string]func(*trainingv1alpha1.TrainingJob){
		"wider": func(j *trainingv1alpha1.TrainingJob) { j.Spec.ReplicaSpecs.Worker.Replicas = ptr(int32(3)) },
		"bigger": func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.ReplicaSpecs.Worker.Template.Spec.Containers[0].Resources.Requests = cpu("64")
		},
	}
	var jobs []*trainingv1alpha1.TrainingJob
	for _, name := range []string{"wider", "bigger"} {
		job := newJob(ns, name, 1, 0, trainingv1alpha1.GangNone)
		job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
		job.Spec.ReplicaSpecs.Worker.Template.Spec.Containers[0].Resources.Requests = cpu("1")
		create(t, job)
		testenv.Eventually(t, 20*time.Second, func() error { _, err := workload(job); return err })
		admit(job)
		waitPods(t, job, 2, 1)
		jobs = append(jobs, job)
	}
	for _, job := range jobs {
		got := getJob(t, job)
		got.Spec.RunPolicy.Suspend = true
		if err := env.Client.Update(ctx, got); err != nil {
			t.Fatal(err)
		}
		waitState(t, job, trainingv1alpha1.StateSuspended)
		waitPods(t, job, 0, 0)
		got = getJob(t, job)
		edits[job.Name](got)
		got.Spec.RunPolicy.Suspend = false
		if err := env.Client.Update(ctx, got); err != nil {
			t.Fatal(err)
		}
	}
	for _, job := range jobs {
		testenv.Eventually(t, 20*time.Second, func() error {
			wl, err := workload(job)
			if err != nil {
				return err
			}
			w := &kueue.Workload{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(wl.Object, w); err != nil {
				return err
			}
			if !w.SamePodSets(podSets(getJob(t, job))) || w.QuotaReserved() {
				var sets []string
				for _, ps := range w.Spec.PodSets {
					sets = append(sets, fmt.Sprintf("%s×%d %v", ps.Name, ps.Count, ps.Template.Spec.Containers[0].Resources.Requests))
				}
				return fmt.Errorf("%s: the Workload still asks for %v (quota reserved: %v) while the job runs %d pods", job.Name, sets, w.QuotaReserved(), len(jobPods(t, job)))
			}
			return nil
		})
		if pods := jobPods(t, job); len(pods) != 0 {
			t.Fatalf("%s runs %d pods under the admission of its old pod sets", job.Name, len(pods))
		}
		if c := cond(getJob(t, job), trainingv1alpha1.ConditionSuspended); c.Status != metav1.ConditionTrue || c.Reason != ReasonQueuedInKueue {
			t.Fatalf("%s: Suspended = %+v, want True, %s", job.Name, c, ReasonQueuedInKueue)
		}
	}
}

// Kueue's waitForPodsReady evicts an admitted Workload whose PodsReady
// condition is not True within its timeout; for an external framework the
// job controller writes that condition (jobframework does for Kueue's own
// jobs). A gang that runs must say so on its Workload, and a gang that
// breaks must say it waits for recovery, or every queued TrainingJob is
// evicted five minutes into its run, whatever its pods do.
func TestKueuePodsReadyFollowsTheGang(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-ready")
	startManager(t)
	ctx := context.Background()
	job := newJob(ns, "ready", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	create(t, job)
	workload := func() (*kueue.Workload, *unstructured.Unstructured, error) { return parsedWorkloadOf(t, job) }
	testenv.Eventually(t, 20*time.Second, func() error { _, _, err := workload(); return err })
	_, u, err := workload()
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now().UTC().Format(time.RFC3339)
	patch := fmt.Sprintf(`{"status":{"admission":{"clusterQueue":"cq","podSetAssignments":[{"name":"master"},{"name":"worker"}]},"conditions":[`+
		`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
		`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q}]}}`, now, now)
	if err := env.Client.Status().Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	podsReady := func(status metav1.ConditionStatus, reason string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() error {
			w, _, err := workload()
			if err != nil {
				return err
			}
			if c := w.Cond(kueue.CondPodsReady); c == nil || c.Status != status || c.Reason != reason {
				return fmt.Errorf("Workload PodsReady = %+v, want %s %s (job state %s)", c, status, reason, getJob(t, job).Status.State)
			}
			return nil
		})
	}
	pods := waitPods(t, job, 2, 1) // attempt 1: the admission resumed the job
	setPods(t, pods, corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)
	podsReady(metav1.ConditionTrue, "Started")

	setPods(t, pods[:1], corev1.PodFailed, 137) // retryable: the gang restarts
	podsReady(metav1.ConditionFalse, "WaitForRecovery")
	pods = waitPods(t, job, 2, 2)
	setPods(t, pods, corev1.PodRunning, 0)
	podsReady(metav1.ConditionTrue, "Recovered")
}

// An admission check's podSetUpdates (a ProvisioningRequest check's
// annotations, without which the pods do not land on the capacity it
// booked) reach the pods of their pod set once the Workload is admitted,
// as jobframework merges them into the pods of Kueue's own jobs, and every
// pod carries its pod set's name in kueue.x-k8s.io/podset.
func TestKueueAdmissionCheckUpdatesReachThePods(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-checks")
	startManager(t)
	ctx := context.Background()
	job := newJob(ns, "prov", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	create(t, job)
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kueue.WorkloadGVK)
	testenv.Eventually(t, 20*time.Second, func() error {
		got := getJob(t, job)
		return env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kueue.WorkloadName(got.Name, got.UID, trainingJobGVK)}, u)
	})
	now := metav1.Now().UTC().Format(time.RFC3339)
	patch := fmt.Sprintf(`{"status":{"admission":{"clusterQueue":"cq","podSetAssignments":[{"name":"master"},{"name":"worker"}]},`+
		`"admissionChecks":[{"name":"prov","state":"Ready","message":"booked","lastTransitionTime":%q,"podSetUpdates":[`+
		`{"name":"master","annotations":{"autoscaling.x-k8s.io/consume-provisioning-request":"prov-master"}},`+
		`{"name":"worker","annotations":{"autoscaling.x-k8s.io/consume-provisioning-request":"prov-worker"}}]}],"conditions":[`+
		`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
		`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q}]}}`, now, now, now)
	if err := env.Client.Status().Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	for _, p := range waitPods(t, job, 2, 1) {
		want := "prov-" + p.Labels[LabelReplicaType]
		if got := p.Annotations["autoscaling.x-k8s.io/consume-provisioning-request"]; got != want {
			t.Errorf("pod %s: consume-provisioning-request = %q, want %q (annotations %v)", p.Name, got, want, p.Annotations)
		}
		// jobframework labels each admitted pod with its pod set.
		if got := p.Labels[kueue.PodSetLabel]; got != p.Labels[LabelReplicaType] {
			t.Errorf("pod %s: %s = %q, want %q", p.Name, kueue.PodSetLabel, got, p.Labels[LabelReplicaType])
		}
	}
}

// A job's Workload carries what jobframework's NewWorkload copies from
// Kueue's own jobs: the kueue.x-k8s.io/max-exec-time-seconds label as
// spec.maximumExecutionTimeSeconds (a value Kueue would not parse is
// left out, as there) and the provreq.kueue.x-k8s.io/* annotations a
// ProvisioningRequest check reads, and nothing else of the job's.
func TestDesiredWorkloadCopiesKueuesLabelsAndAnnotations(t *testing.T) {
	tests := []struct {
		label   string
		want    *int32
		annots  map[string]string
		wantAnn map[string]string
	}{
		{"3600", ptr(int32(3600)), nil, nil},
		{"", nil, map[string]string{"provreq.kueue.x-k8s.io/maxRunDurationSeconds": "600", "team": "a"},
			map[string]string{"provreq.kueue.x-k8s.io/maxRunDurationSeconds": "600"}},
		{"0", nil, nil, nil},
		{"-5", nil, nil, nil},
		{"1h", nil, nil, nil},
		{"99999999999", nil, nil, nil},
	}
	for _, tt := range tests {
		job := newJob("ns", "j", 1, 0, trainingv1alpha1.GangNone)
		job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
		if tt.label != "" {
			job.Labels[kueue.MaxExecTimeLabel] = tt.label
		}
		job.Annotations = tt.annots
		w := &kueue.Workload{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(desiredWorkload(job, nil, nil).Object, w); err != nil {
			t.Fatal(err)
		}
		if got := w.Spec.MaximumExecutionTimeSeconds; !equalPtr(got, tt.want) {
			t.Errorf("label %q: maximumExecutionTimeSeconds %v, want %v", tt.label, got, tt.want)
		}
		if len(w.Annotations) != len(tt.wantAnn) {
			t.Errorf("annotations %v, want %v", w.Annotations, tt.wantAnn)
		}
		for k, v := range tt.wantAnn {
			if w.Annotations[k] != v {
				t.Errorf("annotation %s = %q, want %q", k, w.Annotations[k], v)
			}
		}
	}
}

// The max-exec-time label reaches the Workload, and an edit of it while
// the job waits for Kueue replaces the Workload with one of the new time
// (jobframework: a Workload of another time is not its job's).
func TestKueueMaxExecTimeFollowsTheLabel(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-maxexec")
	startManager(t)
	ctx := context.Background()
	job := newJob(ns, "timed", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team-a", kueue.MaxExecTimeLabel: "600"}
	create(t, job)
	maxExec := func(want int64) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() error {
			wl := &unstructured.Unstructured{}
			wl.SetGroupVersionKind(kueue.WorkloadGVK)
			got := getJob(t, job)
			if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kueue.WorkloadName(got.Name, got.UID, trainingJobGVK)}, wl); err != nil {
				return err
			}
			if v, _, _ := unstructured.NestedInt64(wl.Object, "spec", "maximumExecutionTimeSeconds"); v != want {
				return fmt.Errorf("Workload maximumExecutionTimeSeconds %d, want %d", v, want)
			}
			return nil
		})
	}
	maxExec(600)
	got := getJob(t, job)
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"1200"}}}`, kueue.MaxExecTimeLabel)
	if err := env.Client.Patch(ctx, got, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	maxExec(1200)
}

// The kueue.x-k8s.io/priority-class label is mutable, as in Kueue's own
// integrations: the job's Workload follows it (a raised priority protects
// a running job from preemption), where the Workload's priority came from
// a WorkloadPriorityClass or from nothing.
func TestKueuePriorityFollowsTheLabel(t *testing.T) {
	installWorkloadCRD(t)
	installKueueCRD(t, "workloadpriorityclasses", "WorkloadPriorityClass", apiextensionsv1.ClusterScoped)
	ctx := context.Background()
	for name, value := range map[string]int64{"batch": 100, "urgent": 5000} {
		wpc := &unstructured.Unstructured{}
		wpc.SetGroupVersionKind(kueue.WorkloadPriorityClassGVK)
		wpc.SetName(name)
		wpc.Object["value"] = value
		create(t, wpc)
	}
	ns := namespace(t, "kueue-priority")
	startManager(t)
	job := newJob(ns, "prio", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team-a", kueue.PriorityClassLabel: "batch"}
	create(t, job)
	priority := func(class string, value int64) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() error {
			wl := &unstructured.Unstructured{}
			wl.SetGroupVersionKind(kueue.WorkloadGVK)
			got := getJob(t, job)
			if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kueue.WorkloadName(got.Name, got.UID, trainingJobGVK)}, wl); err != nil {
				return err
			}
			name, _, _ := unstructured.NestedString(wl.Object, "spec", "priorityClassRef", "name")
			v, _, _ := unstructured.NestedInt64(wl.Object, "spec", "priority")
			if name != class || v != value {
				return fmt.Errorf("Workload priority %s=%d, want %s=%d", name, v, class, value)
			}
			return nil
		})
	}
	priority("batch", 100)
	got := getJob(t, job)
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"urgent"}}}`, kueue.PriorityClassLabel)
	if err := env.Client.Patch(ctx, got, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	priority("urgent", 5000)
}

func TestPriorityRelabelled(t *testing.T) {
	wpc := func(name string) *kueue.PriorityClassRef {
		return &kueue.PriorityClassRef{Group: kueue.Group, Kind: kueue.WorkloadPriorityClassGVK.Kind, Name: name}
	}
	pc := &kueue.PriorityClassRef{Group: "scheduling.k8s.io", Kind: "PriorityClass", Name: "high"}
	for _, tt := range []struct {
		name string
		cur  *kueue.PriorityClassRef
		job  *kueuePriority
		want bool
	}{
		{"another WorkloadPriorityClass", wpc("batch"), &kueuePriority{ref: *wpc("urgent"), value: 5000}, true},
		{"the same one", wpc("urgent"), &kueuePriority{ref: *wpc("urgent"), value: 5000}, false},
		{"a Workload without a priority", nil, &kueuePriority{ref: *wpc("urgent"), value: 5000}, true},
		{"a pod PriorityClass's stays", pc, &kueuePriority{ref: *wpc("urgent"), value: 5000}, false},
		{"the job names no WorkloadPriorityClass", wpc("batch"), &kueuePriority{ref: *pc, value: 1000}, false},
		{"the job names none at all", wpc("batch"), nil, false},
	} {
		wl := &kueue.Workload{}
		wl.Spec.PriorityClassRef = tt.cur
		if got := priorityRelabelled(wl, tt.job); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// Kueue v0.15 removed the kueue.x-k8s.io/queue-name annotation (deprecated
// for the label since v0.3): Kueue's jobframework reads the label only,
// and a job that names its LocalQueue in the annotation alone is not
// queued. Loom treats a TrainingJob the same (no Workload; it runs, or
// stays suspended, outside Kueue), but says so on the job, in its
// conditions and a Warning event, rather than leave its author believing it
// waits in the queue.
func TestKueueQueueAnnotationIsNotAQueue(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-annotation")
	startManager(t)
	ctx := context.Background()
	const note = "in the annotation kueue.x-k8s.io/queue-name, which Kueue no longer reads"
	running := newJob(ns, "annotated", 1, 0, trainingv1alpha1.GangNone)
	running.Annotations = map[string]string{kueue.QueueLabel: "team-a"}
	create(t, running)
	suspended := newJob(ns, "annotated-suspended", 1, 0, trainingv1alpha1.GangNone)
	suspended.Annotations = map[string]string{kueue.QueueLabel: "team-a"}
	suspended.Spec.RunPolicy.Suspend = true
	create(t, suspended)

	waitPods(t, running, 2, 0)
	testenv.Eventually(t, 20*time.Second, func() error {
		if c := cond(getJob(t, running), trainingv1alpha1.ConditionCreated); !strings.Contains(c.Message, note) {
			return fmt.Errorf("Created: %q", c.Message)
		}
		if c := cond(getJob(t, suspended), trainingv1alpha1.ConditionSuspended); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, note) {
			return fmt.Errorf("Suspended: %+v", c)
		}
		return nil
	})
	testenv.Eventually(t, 20*time.Second, func() error {
		var list eventsv1.EventList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Regarding.Name == running.Name && e.Type == corev1.EventTypeWarning && e.Reason == ReasonQueueAnnotationIgnored && strings.Contains(e.Note, note) {
				return nil
			}
		}
		return fmt.Errorf("no %s Warning event among %d", ReasonQueueAnnotationIgnored, len(list.Items))
	})
	for _, job := range []*trainingv1alpha1.TrainingJob{running, suspended} {
		got := getJob(t, job)
		wl := &unstructured.Unstructured{}
		wl.SetGroupVersionKind(kueue.WorkloadGVK)
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kueue.WorkloadName(got.Name, got.UID, trainingJobGVK)}, wl); !apierrors.IsNotFound(err) {
			t.Errorf("%s: a job naming its queue in the annotation got a Workload (%v)", job.Name, err)
		}
	}
}

// The job's labels of the keys given (--kueue-label-keys-to-copy, set as
// Kueue's integrations.labelKeysToCopy) reach its Workload, as
// jobframework's NewWorkload copies them for Kueue's own jobs: a key the
// job lacks is left out, other labels are not copied, and the job-uid
// label is Loom's whatever the job says.
func TestDesiredWorkloadCopiesLabelKeys(t *testing.T) {
	tests := []struct {
		name   string
		labels map[string]string
		keys   []string
		want   map[string]string
	}{
		{"none configured", map[string]string{"team": "a"}, nil, map[string]string{}},
		{"copied", map[string]string{"team": "a", "cost-center": "42", "other": "x"}, []string{"team", "cost-center"},
			map[string]string{"team": "a", "cost-center": "42"}},
		{"absent key", map[string]string{"team": "a"}, []string{"team", "project"}, map[string]string{"team": "a"}},
		{"empty value", map[string]string{"team": ""}, []string{"team"}, map[string]string{"team": ""}},
		{"job-uid is Loom's", map[string]string{kueue.JobUIDLabel: "forged"}, []string{kueue.JobUIDLabel}, map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := newJob("ns", "j", 1, 0, trainingv1alpha1.GangNone)
			job.UID = "uid-1"
			job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
			for k, v := range tt.labels {
				job.Labels[k] = v
			}
			got := desiredWorkload(job, nil, tt.keys).GetLabels()
			want := map[string]string{kueue.JobUIDLabel: "uid-1"}
			for k, v := range tt.want {
				want[k] = v
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Workload labels %v, want %v", got, want)
			}
		})
	}
}

// workloadOf reads the Workload of job as it is now (its name follows the
// job's UID).
func workloadOf(t *testing.T, job *trainingv1alpha1.TrainingJob) (*unstructured.Unstructured, error) {
	t.Helper()
	got := getJob(t, job)
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kueue.WorkloadGVK)
	key := types.NamespacedName{Namespace: got.Namespace, Name: kueue.WorkloadName(got.Name, got.UID, trainingJobGVK)}
	return u, env.Client.Get(context.Background(), key, u)
}

// parsedWorkloadOf is workloadOf's Workload, parsed too.
func parsedWorkloadOf(t *testing.T, job *trainingv1alpha1.TrainingJob) (*kueue.Workload, *unstructured.Unstructured, error) {
	t.Helper()
	u, err := workloadOf(t, job)
	if err != nil {
		return nil, nil, err
	}
	w := &kueue.Workload{}
	return w, u, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, w)
}

// setQueueLabel sets job's queue label to value, a JSON value (null
// removes it).
func setQueueLabel(t *testing.T, job *trainingv1alpha1.TrainingJob, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, kueue.QueueLabel, value)
	if err := env.Client.Patch(context.Background(), getJob(t, job), client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// statusPatch merge-patches the status of Workload u, as Kueue does.
func statusPatch(t *testing.T, u *unstructured.Unstructured, patch string) {
	t.Helper()
	if err := env.Client.Status().Patch(context.Background(), u, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// admitWorkload admits Workload u (its pod sets master and worker) in
// ClusterQueue cq, as Kueue does: quota reserved, admitted.
func admitWorkload(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	now := metav1.Now().UTC().Format(time.RFC3339)
	statusPatch(t, u, fmt.Sprintf(`{"status":{"admission":{"clusterQueue":"cq","podSetAssignments":[{"name":"master"},{"name":"worker"}]},"conditions":[`+
		`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
		`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q}]}}`, now, now))
}
