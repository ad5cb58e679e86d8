package rayjob

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/loom-dev/loom/controllers/rayjob/rayfake"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// directReconciler is a reconciler of the test's own, reading from and
// writing to the API server through c, its dashboard fake.
func directReconciler(c client.Client, fake *rayfake.Server, rec *events.FakeRecorder) *Reconciler {
	r := &Reconciler{Client: c, APIReader: env.Client, Recorder: rec,
		DashboardFor: func(string) Dashboard { return NewHTTPDashboard(fake.URL(), DashboardTimeout) }}
	r.writer = apply.NewWriter(c, FieldOwner, apply.Options{Live: env.Client})
	return r
}

func recorded(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A child write refused for a conflict (the object was written since the
// pass read it) is no trouble of the RayJob's: no Warning, the status says
// what the pass decided, not the conflict, and the pass runs again
// shortly, when the write goes through.
func TestAChildWriteConflictIsNotTheRayJobsTrouble(t *testing.T) {
	ctx := context.Background()
	fake := newFake(t, time.Hour)
	m := startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-child-conflict")
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	testenv.Eventually(t, 30*time.Second, func() error {
		if len(submitters(t, rj.Namespace)) == 1 {
			return nil
		}
		return fmt.Errorf("no submitter Job yet")
	})
	waitJob(t, rj, "running", deploymentStatus(rayv1.JobDeploymentStatusRunning))
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	sj := submitters(t, rj.Namespace)[0]
	if err := env.Client.Delete(ctx, &sj, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := len(submitters(t, rj.Namespace)); n != 0 {
			return fmt.Errorf("%d submitters left", n)
		}
		return nil
	})

	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	conflicts := 1
	c := interceptor.NewClient(direct, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if obj.GetObjectKind().GroupVersionKind().Kind == "Job" && conflicts > 0 {
				conflicts--
				return apierrors.NewConflict(schema.GroupResource{Group: "batch", Resource: "jobs"}, obj.GetName(), fmt.Errorf("the object has been modified"))
			}
			return c.Create(ctx, obj, opts...)
		}})
	rec := events.NewFakeRecorder(20)
	r := directReconciler(c, fake, rec)
	res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rj)})
	if err != nil {
		t.Fatalf("a pass whose submitter create met a conflict failed: %v", err)
	}
	if conflicts != 0 {
		t.Fatal("the pass made no submitter")
	}
	if res.RequeueAfter == 0 || res.RequeueAfter > conflictRetry {
		t.Errorf("the pass that met a conflict looks again after %v, want at most %v", res.RequeueAfter, conflictRetry)
	}
	for _, e := range recorded(rec) {
		if strings.HasPrefix(e, "Warning") {
			t.Errorf("a conflict was warned of: %s", e)
		}
	}
	got := getJob(t, rj)
	if got.Status.JobDeploymentStatus != rayv1.JobDeploymentStatusRunning || strings.Contains(got.Status.Message, "modified") {
		t.Errorf("status after the conflict %q: %q, want Running, the conflict unsaid", got.Status.JobDeploymentStatus, got.Status.Message)
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rj)}); err != nil {
		t.Fatal(err)
	}
	var jobs batchv1.JobList
	if err := env.Client.List(ctx, &jobs, client.InNamespace(rj.Namespace)); err != nil || len(jobs.Items) != 1 {
		t.Fatalf("the next pass made %d submitters (%v), want 1", len(jobs.Items), err)
	}
}

// A submitter template the API server refuses in a pod (a dry run of one
// submitter pod, before anything is made) holds the RayJob
// ValidationFailed quoting the refused fields, with an InvalidRayJobSpec
// Warning and no RayCluster or submitter Job made, instead of a cluster
// brought up for a Job whose pods are never made; mended, it runs.
func TestARefusedSubmitterTemplateHoldsTheRayJob(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		bad   func(*corev1.PodSpec)
		field string
	}{
		{"env var name", func(s *corev1.PodSpec) { s.Containers[0].Env = []corev1.EnvVar{{Name: "A=B", Value: "x"}} }, ".spec.containers[0].env[0].name"},
		{"duplicate container name", func(s *corev1.PodSpec) {
			s.InitContainers = []corev1.Container{{Name: s.Containers[0].Name, Image: "busybox"}}
		}, ".spec.initContainers[0].name"},
		{"requests above limits", func(s *corev1.PodSpec) {
			s.Containers[0].Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}
		}, ".spec.containers[0].resources.requests"},
	}
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rj := sampleJob(t, "ray-job.sample.yaml", fmt.Sprintf("rj-refused-submitter-%d", i))
			rj.Spec.SubmitterPodTemplate = &corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "submitter", Image: "rayproject/ray:2.46.0"}}}}
			tt.bad(&rj.Spec.SubmitterPodTemplate.Spec)
			create(t, rj)
			got := waitJob(t, rj, "held on its submitter template", deploymentStatus(rayv1.JobDeploymentStatusValidationFailed))
			if want := "spec.submitterPodTemplate" + tt.field; !strings.Contains(got.Status.Message, want) || got.Status.Reason != rayv1.ValidationFailed {
				t.Fatalf("status %q %q, want ValidationFailed naming %s", got.Status.Reason, got.Status.Message, want)
			}
			warned(t, rj, "InvalidRayJobSpec")
			time.Sleep(time.Second) // passes after the hold make nothing either
			var clusters rayv1.RayClusterList
			if err := env.Client.List(ctx, &clusters, client.InNamespace(rj.Namespace)); err != nil || len(clusters.Items) != 0 {
				t.Fatalf("a held RayJob made %d RayClusters (%v)", len(clusters.Items), err)
			}
			if n := len(submitters(t, rj.Namespace)); n != 0 {
				t.Fatalf("a held RayJob made %d submitter Jobs", n)
			}
			if i > 0 {
				return
			}
			updateJob(t, rj, func(j *rayv1.RayJob) { j.Spec.SubmitterPodTemplate.Spec.Containers[0].Env = nil })
			waitCluster(t, rj)
		})
	}
}

// A submitter Job the API server refuses where a pod of its template
// would pass (a template label the Job sets itself, an admission policy on
// Jobs, which refuses KubeRay's default template too) holds the RayJob
// ValidationFailed before anything is made, the message quoting the
// refused fields as the RayJob's and naming the Job as it would be named
// (the RayJob's name), never by the dry run's generated name nor its UID,
// instead of a cluster brought up for a Job whose create fails on every
// pass. A template label job-name of the Job's own name, which the API
// server would set, is no refusal; nor is the RayJob's owner reference,
// which the dry run carries as the Job would (a policy that Jobs be
// owned).
func TestARefusedSubmitterJobHoldsTheRayJob(t *testing.T) {
	ctx := context.Background()
	template := func(labels map[string]string) *corev1.PodTemplateSpec {
		return &corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "submitter", Image: "rayproject/ray:2.46.0"}}}}
	}
	needATTL := &admissionregistrationv1.Validation{Expression: "has(object.spec.ttlSecondsAfterFinished)", Message: "ttlSecondsAfterFinished is required"}
	tests := []struct {
		name   string
		edit   func(*rayv1.RayJob)
		policy *admissionregistrationv1.Validation
		want   string // a pattern of what the message quotes; "": admitted
	}{
		{"a controller-uid template label", func(j *rayv1.RayJob) {
			j.Spec.SubmitterPodTemplate = template(map[string]string{"controller-uid": "mine"})
		},
			nil, `spec\.submitterPodTemplate\.metadata\.labels\[controller-uid\]: Invalid value: .*"job-name":"rayjob-sample".*: must be '<uid>'$`},
		{"a job-name template label of another name", func(j *rayv1.RayJob) {
			j.Spec.SubmitterPodTemplate = template(map[string]string{batchv1.JobNameLabel: "another"})
		}, nil, `spec\.submitterPodTemplate\.metadata\.labels\[batch\.kubernetes\.io/job-name\]: Invalid value: .*: must be 'rayjob-sample'$`},
		{"a policy on Jobs, KubeRay's default template", func(*rayv1.RayJob) {}, needATTL, `spec: ValidatingAdmissionPolicy .* denied request: ttlSecondsAfterFinished is required$`},
		{"a policy naming the Job", func(*rayv1.RayJob) {},
			&admissionregistrationv1.Validation{Expression: "has(object.spec.ttlSecondsAfterFinished)", MessageExpression: "'Job ' + object.metadata.name + ' needs a TTL'"},
			`spec: ValidatingAdmissionPolicy .* denied request: Job rayjob-sample needs a TTL$`},
		{"a job-name template label of the Job's own name", func(j *rayv1.RayJob) {
			j.Spec.SubmitterPodTemplate = template(map[string]string{batchv1.JobNameLabel: j.Name, "job-name": j.Name})
		}, nil, ""},
		{"a policy that Jobs be owned", func(*rayv1.RayJob) {},
			&admissionregistrationv1.Validation{Expression: "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, r.kind == 'RayJob' && r.controller)", Message: "a Job must be controlled by a RayJob"},
			""},
	}
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rj := sampleJob(t, "ray-job.sample.yaml", fmt.Sprintf("rj-refused-job-%d", i))
			if tt.policy != nil {
				jobsMust(t, rj.Namespace, *tt.policy)
			}
			tt.edit(rj)
			create(t, rj)
			if tt.want == "" {
				waitCluster(t, rj)
				return
			}
			got := waitJob(t, rj, "held on its submitter Job", deploymentStatus(rayv1.JobDeploymentStatusValidationFailed))
			if !regexp.MustCompile(`^the API server refuses the submitter Job: `+tt.want).MatchString(got.Status.Message) || got.Status.Reason != rayv1.ValidationFailed {
				t.Fatalf("status %q %q, want ValidationFailed naming %s", got.Status.Reason, got.Status.Message, tt.want)
			}
			if regexp.MustCompile(`rayjob-sample-[a-z0-9]{5}`).MatchString(got.Status.Message) {
				t.Fatalf("the message names the dry run's Job: %s", got.Status.Message)
			}
			warned(t, rj, "InvalidRayJobSpec")
			time.Sleep(time.Second) // passes after the hold make nothing either
			var clusters rayv1.RayClusterList
			if err := env.Client.List(ctx, &clusters, client.InNamespace(rj.Namespace)); err != nil || len(clusters.Items) != 0 {
				t.Fatalf("a held RayJob made %d RayClusters (%v)", len(clusters.Items), err)
			}
			if n := len(submitters(t, rj.Namespace)); n != 0 {
				t.Fatalf("a held RayJob made %d submitter Jobs", n)
			}
		})
	}
}

// jobsMust has the API server refuse, in namespace ns only, a Job that
// fails the validation v (a ValidatingAdmissionPolicy, as a cluster's
// policy may ask), once a dry run says the policy is in force.
func jobsMust(t *testing.T, ns string, v admissionregistrationv1.Validation) {
	t.Helper()
	probe := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: ns}, Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}
	policyOn(t, ns, "batch", "jobs", v, probe)
}

// policyOn has the API server refuse, in namespace ns only, an object of
// the group's resource that fails the validation v (a
// ValidatingAdmissionPolicy), once a dry run of probe, which fails it,
// says the policy is in force.
func policyOn(t *testing.T, ns, group, resource string, v admissionregistrationv1.Validation, probe client.Object) {
	t.Helper()
	ctx := context.Background()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + resource + "-must"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{resource}}}}}},
			Validations: []admissionregistrationv1.Validation{v},
		}}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}}}}
	create(t, policy)
	create(t, binding)
	t.Cleanup(func() {
		_ = env.Client.Delete(ctx, binding)
		_ = env.Client.Delete(ctx, policy)
	})
	testenv.Eventually(t, 30*time.Second, func() error {
		if err := env.Client.Create(ctx, probe.DeepCopyObject().(client.Object), client.DryRunAll); !apierrors.IsInvalid(err) {
			return fmt.Errorf("the policy is not in force yet: %v", err)
		}
		return nil
	})
}

// The submitter pod's dry run is a pod as the Job controller makes it,
// controlled by the Job: under a policy that pods be controlled (no bare
// pods), a RayJob with a submitterPodTemplate runs, instead of being held
// ValidationFailed on the dry run's want of an owner.
func TestTheSubmitterPodsDryRunIsControlledByItsJob(t *testing.T) {
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-owned-pods")
	rj.Spec.SubmitterPodTemplate = &corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "submitter", Image: "rayproject/ray:2.46.0"}}}}
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: rj.Namespace},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	policyOn(t, rj.Namespace, "", "pods", admissionregistrationv1.Validation{
		Expression: "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller)",
		Message:    "a pod must have a controller"}, probe)
	create(t, rj)
	if _, got := waitCluster(t, rj); got.Status.JobDeploymentStatus == rayv1.JobDeploymentStatusValidationFailed {
		t.Fatalf("held: %s", got.Status.Message)
	}
}

// A RayCluster the API server refuses for the RayJob (an admission policy
// on RayClusters, which the RayJob's labels and rayClusterSpec reach)
// holds the RayJob ValidationFailed before anything is made, the message
// quoting the refusal and naming the cluster as an attempt's would be
// named, instead of a RayJob started whose cluster's create fails on
// every pass; mended, it runs.
func TestARefusedClusterHoldsTheRayJob(t *testing.T) {
	ctx := context.Background()
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-refused-cluster")
	probe := &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: rj.Namespace}, Spec: *rj.Spec.RayClusterSpec.DeepCopy()}
	policyOn(t, rj.Namespace, "ray.io", "rayclusters", admissionregistrationv1.Validation{
		Expression:        "has(object.metadata.labels) && 'team' in object.metadata.labels",
		MessageExpression: "'RayCluster ' + object.metadata.name + ' needs a team label'"}, probe)
	create(t, rj)
	got := waitJob(t, rj, "held on its cluster", deploymentStatus(rayv1.JobDeploymentStatusValidationFailed))
	want := `^the API server refuses the RayCluster: spec: ValidatingAdmissionPolicy .* denied request: RayCluster rayjob-sample-<random> needs a team label$`
	if !regexp.MustCompile(want).MatchString(got.Status.Message) || got.Status.Reason != rayv1.ValidationFailed {
		t.Fatalf("status %q %q, want ValidationFailed matching %s", got.Status.Reason, got.Status.Message, want)
	}
	warned(t, rj, "InvalidRayJobSpec")
	time.Sleep(time.Second) // passes after the hold make nothing either
	var clusters rayv1.RayClusterList
	if err := env.Client.List(ctx, &clusters, client.InNamespace(rj.Namespace)); err != nil || len(clusters.Items) != 0 {
		t.Fatalf("a held RayJob made %d RayClusters (%v)", len(clusters.Items), err)
	}
	updateJob(t, rj, func(j *rayv1.RayJob) { j.Labels = map[string]string{"team": "ml"} })
	rc, _ := waitCluster(t, rj)
	if rc.Labels["team"] != "ml" {
		t.Fatalf("cluster labels %v", rc.Labels)
	}
}

// A RayJob past its deadline whose dashboard does not answer the stop
// tries again, the message saying so, and stops its Ray job once the
// dashboard answers: jobStatus STOPPED, one Warning, one StoppedRayJob.
func TestAFailedStopIsTriedAgainUntilItGoesThrough(t *testing.T) {
	fake := newFake(t, time.Hour)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-stop-again")
	// Once the manager has stopped (cleanups run last first): the failed
	// RayJob's series would be in the other tests' registry.
	t.Cleanup(func() { forgetMetrics(client.ObjectKeyFromObject(rj)) })
	startManager(t, fake)
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	rj.Spec.ActiveDeadlineSeconds = ptr.To[int32](8)
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	running := waitJob(t, rj, "running its Ray job", func(j *rayv1.RayJob) bool { return j.Status.JobStatus == rayv1.JobStatusRunning })
	fake.SetDown(true)
	waitJob(t, rj, "saying its stop failed", func(j *rayv1.RayJob) bool {
		return j.Status.JobDeploymentStatus == rayv1.JobDeploymentStatusFailed && strings.Contains(j.Status.Message, "stopping Ray job "+running.Status.JobId+" failed (")
	})
	fake.SetDown(false)
	got := waitJob(t, rj, "its Ray job stopped", func(j *rayv1.RayJob) bool { return j.Status.JobStatus == rayv1.JobStatusStopped })
	if got.Status.Reason != rayv1.DeadlineExceeded || strings.Contains(got.Status.Message, "stopping Ray job") {
		t.Fatalf("status %+v, want DeadlineExceeded, the failed stop no longer said", got.Status)
	}
	info, err := NewHTTPDashboard(fake.URL(), DashboardTimeout).Get(context.Background(), running.Status.JobId)
	if err != nil || info.JobStatus != rayv1.JobStatusStopped {
		t.Fatalf("the Ray job: %+v %v, want STOPPED", info, err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if w, n := eventsOf(t, rj, corev1.EventTypeWarning, "FailedToStopRayJob"), eventsOf(t, rj, corev1.EventTypeNormal, "StoppedRayJob"); len(w) != 1 || len(n) != 1 {
			return fmt.Errorf("%d FailedToStopRayJob and %d StoppedRayJob events, want 1 and 1", len(w), len(n))
		}
		return nil
	})
}
