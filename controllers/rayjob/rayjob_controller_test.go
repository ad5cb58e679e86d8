package rayjob

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/controllers/rayjob/rayfake"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// startManager runs the rayjob controller, every dashboard request going
// to fake (an envtest head pod runs no dashboard). Controllers never
// import each other: the tests play the raycluster controller's part
// through the API, writing the RayCluster's status and head Service as it
// does.
func startManager(t *testing.T, fake *rayfake.Server) *testenv.Manager {
	t.Helper()
	t.Setenv(EnvDashboardOverride, fake.URL())
	reg := &manager.Registry{}
	reg.Add("rayjob", Setup)
	opts := testenv.ManagerOptions(t)
	opts.LeaderElect = false
	return env.StartManager(t, opts, reg)
}

// newFake is a fake dashboard whose jobs run for runFor.
func newFake(t *testing.T, runFor time.Duration) *rayfake.Server {
	t.Helper()
	fake := rayfake.New()
	fake.PendingFor, fake.RunFor = 200*time.Millisecond, runFor
	t.Cleanup(fake.Close)
	return fake
}

// sampleJob is KubeRay's own sample RayJob (config/samples/<file>), in
// namespace ns.
func sampleJob(t *testing.T, file, ns string) *rayv1.RayJob {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ray-project/kuberay/ray-operator").Output()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "config", "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	j := &rayv1.RayJob{}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(doc, "kind: RayJob") {
			if err := yaml.Unmarshal([]byte(doc), j); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
		}
	}
	j.Namespace = ns
	if err := env.CreateNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return j
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

func getJob(t *testing.T, rj *rayv1.RayJob) *rayv1.RayJob {
	t.Helper()
	got := &rayv1.RayJob{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(rj), got); err != nil {
		t.Fatal(err)
	}
	return got
}

func updateJob(t *testing.T, rj *rayv1.RayJob, f func(*rayv1.RayJob)) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		got := getJob(t, rj)
		f(got)
		return env.Client.Update(context.Background(), got)
	})
}

// waitJob waits until ok says the RayJob is where it should be.
func waitJob(t *testing.T, rj *rayv1.RayJob, what string, ok func(*rayv1.RayJob) bool) *rayv1.RayJob {
	t.Helper()
	var got *rayv1.RayJob
	testenv.Eventually(t, 60*time.Second, func() error {
		got = getJob(t, rj)
		if !ok(got) {
			return fmt.Errorf("RayJob %s is not %s: status %+v", rj.Name, what, got.Status)
		}
		return nil
	})
	return got
}

func deploymentStatus(s rayv1.JobDeploymentStatus) func(*rayv1.RayJob) bool {
	return func(j *rayv1.RayJob) bool { return j.Status.JobDeploymentStatus == s }
}

// waitCluster waits for the RayCluster the RayJob's status names, and
// returns it with the RayJob.
func waitCluster(t *testing.T, rj *rayv1.RayJob) (*rayv1.RayCluster, *rayv1.RayJob) {
	t.Helper()
	rc := &rayv1.RayCluster{}
	var got *rayv1.RayJob
	testenv.Eventually(t, 30*time.Second, func() error {
		got = getJob(t, rj)
		if got.Status.RayClusterName == "" {
			return fmt.Errorf("no cluster named yet: %+v", got.Status)
		}
		return env.Client.Get(context.Background(), client.ObjectKey{Namespace: rj.Namespace, Name: got.Status.RayClusterName}, rc)
	})
	return rc, got
}

// clusterGone waits until the RayCluster is deleted (envtest runs no
// garbage collector: its pods stay, but the cluster object goes at once).
func clusterGone(t *testing.T, rc *rayv1.RayCluster) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), &rayv1.RayCluster{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("RayCluster %s still there (%v)", rc.Name, err)
	})
}

// controlledBy checks that obj is controlled by the RayJob, blocking its
// owner's deletion as KubeRay's children do: a real cluster's garbage
// collector deletes it with the RayJob, and Kueue skips it.
func controlledBy(t *testing.T, obj client.Object, rj *rayv1.RayJob) {
	t.Helper()
	refs := obj.GetOwnerReferences()
	if len(refs) != 1 || refs[0].Kind != "RayJob" || refs[0].UID != rj.UID || refs[0].Controller == nil || !*refs[0].Controller ||
		refs[0].BlockOwnerDeletion == nil || !*refs[0].BlockOwnerDeletion {
		t.Fatalf("%s: owners %+v, want the controller reference of RayJob %s (%s)", obj.GetName(), refs, rj.Name, rj.UID)
	}
}

// bringUp does what the raycluster controller does for a cluster whose
// pods are all running and ready: the head Service (labelled Loom's when
// loomService, as Loom's raycluster controller labels it; unlabelled as
// KubeRay's), then state ready and KubeRay's conditions, keeping the
// cluster's other conditions.
func bringUp(t *testing.T, rc *rayv1.RayCluster, loomService bool) {
	t.Helper()
	name, err := utils.GenerateHeadServiceName(utils.RayClusterCRD, rc.Spec, rc.Name)
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: rc.Namespace}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"ray.io/cluster": rc.Name, "ray.io/node-type": "head"},
		Ports:    []corev1.ServicePort{{Name: utils.DashboardPortName, Port: 8265}, {Name: "gcs-server", Port: 6379}},
	}}
	if loomService {
		svc.Labels = map[string]string{"app.kubernetes.io/managed-by": "loom"}
	}
	create(t, svc)
	setClusterStatus(t, rc, func(st *rayv1.RayClusterStatus) {
		st.State = rayv1.Ready
		setCondition(st, string(rayv1.HeadPodReady), metav1.ConditionTrue, rayv1.HeadPodRunningAndReady, "the head pod is running and ready")
		setCondition(st, string(rayv1.RayClusterProvisioned), metav1.ConditionTrue, rayv1.AllPodRunningAndReadyFirstTime, "all Ray pods are running and ready")
	})
}

// setClusterStatus changes the cluster's status as the raycluster
// controller would.
func setClusterStatus(t *testing.T, rc *rayv1.RayCluster, f func(*rayv1.RayClusterStatus)) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		got := &rayv1.RayCluster{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), got); err != nil {
			return err
		}
		f(&got.Status)
		return env.Client.Status().Update(context.Background(), got)
	})
}

func setCondition(st *rayv1.RayClusterStatus, typ string, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg})
}

// submitters lists the namespace's Jobs a RayJob created.
func submitters(t *testing.T, ns string) []batchv1.Job {
	t.Helper()
	var list batchv1.JobList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{"ray.io/originated-from-crd": "RayJob"}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func envOf(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		out[e.Name] = e.Value
	}
	return out
}

// finishSubmitter sets a submitter Job's status to Complete, as the job
// controller would once its pod succeeded (the API server checks the
// transition: start and completion times, SuccessCriteriaMet first).
func finishSubmitter(t *testing.T, sj *batchv1.Job) {
	t.Helper()
	now := metav1.Now()
	started := metav1.NewTime(now.Add(-time.Second))
	sj.Status.StartTime, sj.Status.CompletionTime, sj.Status.Succeeded = &started, &now, 1
	sj.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastProbeTime: now, LastTransitionTime: now},
		{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastProbeTime: now, LastTransitionTime: now},
	}
	if err := env.Client.Status().Update(context.Background(), sj); err != nil {
		t.Fatal(err)
	}
}

// gathered is controller-runtime's metrics registry, one line per series:
// name{labels sorted by name} value (a histogram's value is its count).
func gathered(t *testing.T) string {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue()
			if c := m.GetCounter(); c != nil {
				v = c.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				v = float64(h.GetSampleCount())
			}
			fmt.Fprintf(&b, "%s{%s} %v\n", f.GetName(), strings.Join(ls, ","), v)
		}
	}
	return b.String()
}

func runsObserved(t *testing.T) float64 {
	t.Helper()
	var v float64
	for _, line := range strings.Split(gathered(t), "\n") {
		if strings.HasPrefix(line, "loom_rayjob_time_to_running_seconds{") {
			_, _ = fmt.Sscanf(line[strings.LastIndex(line, " ")+1:], "%g", &v)
		}
	}
	return v
}

func hasSeries(t *testing.T, series string) error {
	t.Helper()
	if !strings.Contains(gathered(t), series) {
		return fmt.Errorf("the registry lacks %s", series)
	}
	return nil
}

var clusterName = regexp.MustCompile(`^rayjob-sample-[a-z0-9]{5}$`)

// KubeRay's sample RayJob in K8sJobMode against the API server: an owned
// RayCluster named as KubeRay names it, carrying the RayJob's labels; the
// submitter Job only once the cluster is ready, exactly one; Complete when
// the Ray job and the submitter are done, the cluster deleted after
// (shutdownAfterJobFinishes); KubeRay's RayJob metrics and Loom's time to
// running on the manager's registry, the RayJob's series gone with it.
func TestRayJobRunsOnTheClusterItCreates(t *testing.T) {
	ctx := context.Background()
	fake := newFake(t, 500*time.Millisecond)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-sample")
	rj.Labels = map[string]string{"team": "ml", "ray.io/priority-class-name": "batch"}
	rj.Spec.ShutdownAfterJobFinishes = true
	runs := runsObserved(t)
	create(t, rj)

	rc, got := waitCluster(t, rj)
	if !clusterName.MatchString(rc.Name) {
		t.Fatalf("RayCluster name %q is not <rayjob>-<5 random characters>", rc.Name)
	}
	controlledBy(t, rc, got)
	for k, v := range map[string]string{"team": "ml", "ray.io/priority-class-name": "batch",
		"ray.io/originated-from-cr-name": rj.Name, "ray.io/originated-from-crd": "RayJob"} {
		if rc.Labels[k] != v {
			t.Fatalf("RayCluster label %s = %q, want %q (labels %v)", k, rc.Labels[k], v, rc.Labels)
		}
	}
	if got.Status.JobId == "" || got.Status.JobDeploymentStatus != rayv1.JobDeploymentStatusInitializing {
		t.Fatalf("status before the cluster is ready: %+v", got.Status)
	}
	if sj := submitters(t, rj.Namespace); len(sj) != 0 {
		t.Fatalf("a submitter Job before the cluster is ready: %s", sj[0].Name)
	}

	bringUp(t, rc, true)
	got = waitJob(t, rj, "Running", deploymentStatus(rayv1.JobDeploymentStatusRunning))
	var sj batchv1.Job
	testenv.Eventually(t, 10*time.Second, func() error {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(rj), &sj)
	})
	controlledBy(t, &sj, got)
	e := envOf(sj.Spec.Template.Spec.Containers[0])
	if e["RAY_JOB_SUBMISSION_ID"] != got.Status.JobId || e["RAY_DASHBOARD_ADDRESS"] != got.Status.DashboardURL || got.Status.DashboardURL == "" {
		t.Fatalf("submitter env %v, status %+v", e, got.Status)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if runsObserved(t) <= runs {
			return fmt.Errorf("loom_rayjob_time_to_running_seconds has no new observation")
		}
		return nil
	})

	// The submitter's `ray job submit`, then its end, as on a real cluster.
	if _, err := fake.Submit(utiltypes.RayJobRequest{SubmissionId: got.Status.JobId, Entrypoint: rj.Spec.Entrypoint}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(fake.PendingFor + fake.RunFor)
	finishSubmitter(t, &sj)
	got = waitJob(t, rj, "Complete", deploymentStatus(rayv1.JobDeploymentStatusComplete))
	if got.Status.JobStatus != rayv1.JobStatusSucceeded || got.Status.Succeeded == nil || *got.Status.Succeeded != 1 {
		t.Fatalf("status %+v", got.Status)
	}
	clusterGone(t, rc)
	if all := submitters(t, rj.Namespace); len(all) != 1 || all[0].UID != sj.UID {
		t.Fatalf("submitter Jobs %d, want the one %s", len(all), sj.UID)
	}

	labels := fmt.Sprintf(`name=%q,namespace=%q`, rj.Name, rj.Namespace)
	duration := fmt.Sprintf(`kuberay_job_execution_duration_seconds{job_deployment_status="Complete",%s,retry_count="0",uid=%q}`, labels, got.UID)
	for _, series := range []string{
		fmt.Sprintf(`kuberay_job_info{%s,uid=%q} 1`, labels, got.UID),
		fmt.Sprintf(`kuberay_job_deployment_status{deployment_status="Complete",%s,uid=%q} 1`, labels, got.UID),
		duration,
	} {
		testenv.Eventually(t, 10*time.Second, func() error { return hasSeries(t, series) })
	}

	if err := env.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(rj), &rayv1.RayJob{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("RayJob still there (%v)", err)
		}
		if hasSeries(t, duration) == nil || hasSeries(t, fmt.Sprintf(`kuberay_job_info{%s`, labels)) == nil {
			return fmt.Errorf("the deleted RayJob's series are still on the registry")
		}
		return nil
	})
}

// A RayJob created suspended (as Kueue's webhook creates one with a queue
// label) gets no cluster; resumed, it runs (HTTPMode: Loom submits, once)
// on a cluster that carries the queue label and the RayJob's controller
// reference (so that Kueue skips it); suspended while running, its
// cluster is deleted as KubeRay does; deleted, it stops its Ray job first.
func TestRayJobSuspendResumeAndDelete(t *testing.T) {
	ctx := context.Background()
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-suspend")
	rj.Labels = map[string]string{"kueue.x-k8s.io/queue-name": "user-queue"}
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	rj.Spec.Suspend, rj.Spec.ShutdownAfterJobFinishes = true, true
	create(t, rj)
	waitJob(t, rj, "Suspended", deploymentStatus(rayv1.JobDeploymentStatusSuspended))
	time.Sleep(2 * time.Second) // a pass or two more
	var rcs rayv1.RayClusterList
	if err := env.Client.List(ctx, &rcs, client.InNamespace(rj.Namespace)); err != nil || len(rcs.Items) != 0 {
		t.Fatalf("a suspended RayJob has %d clusters (%v)", len(rcs.Items), err)
	}
	if ids := fake.JobIDs(); len(ids) != 0 {
		t.Fatalf("a suspended RayJob submitted %v", ids)
	}

	first := runUntilSubmitted(t, rj, fake)
	updateJob(t, rj, func(j *rayv1.RayJob) { j.Spec.Suspend = true })
	got := waitJob(t, rj, "Suspended again", deploymentStatus(rayv1.JobDeploymentStatusSuspended))
	clusterGone(t, first)
	if got.Status.RayClusterName != "" || got.Status.JobId != "" {
		t.Fatalf("a suspended RayJob keeps %+v", got.Status)
	}

	second := runUntilSubmitted(t, rj, fake)
	if second.Name == first.Name {
		t.Fatalf("the resumed RayJob reuses RayCluster %s", first.Name)
	}
	got = getJob(t, rj)
	if err := env.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(rj), &rayv1.RayJob{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("RayJob still there (%v)", err)
		}
		return nil
	})
	info, err := NewHTTPDashboard(fake.URL(), DashboardTimeout).Get(ctx, got.Status.JobId)
	if err != nil || info.JobStatus != rayv1.JobStatusStopped {
		t.Fatalf("the deleted RayJob's Ray job: %+v %v, want STOPPED", info, err)
	}
}

// runUntilSubmitted resumes the RayJob, brings its new cluster up and
// waits until Loom has submitted the Ray job (HTTPMode), exactly once.
func runUntilSubmitted(t *testing.T, rj *rayv1.RayJob, fake *rayfake.Server) *rayv1.RayCluster {
	t.Helper()
	updateJob(t, rj, func(j *rayv1.RayJob) { j.Spec.Suspend = false })
	rc, got := waitCluster(t, rj)
	controlledBy(t, rc, got)
	if rc.Labels["kueue.x-k8s.io/queue-name"] != "user-queue" {
		t.Fatalf("RayCluster labels %v lack the RayJob's queue", rc.Labels)
	}
	bringUp(t, rc, true)
	got = waitJob(t, rj, "running its Ray job", func(j *rayv1.RayJob) bool {
		return j.Status.JobStatus == rayv1.JobStatusRunning && j.Status.RayClusterName == rc.Name
	})
	if n := fake.Submissions(got.Status.JobId); n != 1 {
		t.Fatalf("Ray job %s submitted %d times", got.Status.JobId, n)
	}
	return rc
}

// warned waits for a Warning event of reason on the RayJob.
func warned(t *testing.T, rj *rayv1.RayJob, reason rayv1.JobFailedReason) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		if len(eventsOf(t, rj, corev1.EventTypeWarning, string(reason))) != 0 {
			return nil
		}
		return fmt.Errorf("no %s Warning on RayJob %s", reason, rj.Name)
	})
}

// eventsOf lists the RayJob's events of type and reason.
func eventsOf(t *testing.T, rj *rayv1.RayJob, typ, reason string) []eventsv1.Event {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(rj.Namespace)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "RayJob" && e.Regarding.Name == rj.Name && e.Type == typ && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// neverFitsMsg is the raycluster controller's loom.dev/GPUInventory
// message for a group no node can hold.
const neverFitsMsg = "group small-group: needs 1 pod × 16 nvidia.com/gpu (16 in all); this cluster has 1 node with 8 GPUs, none with more than 8: a pod is bigger than any node it may go to, it can never fit"

// A RayJob whose cluster can never fit says so, naming the cluster and the
// inventory's gap, and submits nothing, not even once the cluster reads
// ready; when the verdict goes (nodes joined), it runs.
func TestRayJobSaysItsClusterCanNeverFit(t *testing.T) {
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-neverfits")
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	setClusterStatus(t, rc, func(st *rayv1.RayClusterStatus) {
		setCondition(st, "loom.dev/GPUInventory", metav1.ConditionFalse, "NeverFits", neverFitsMsg)
	})
	want := "RayCluster " + rc.Name + " can never fit: " + neverFitsMsg
	neverFits := func(j *rayv1.RayJob) bool {
		return j.Status.Reason == ReasonClusterNeverFits && j.Status.Message == want
	}
	waitJob(t, rj, "held by its cluster that never fits", neverFits)
	warned(t, rj, ReasonClusterNeverFits)

	bringUp(t, rc, true)
	time.Sleep(2 * time.Second) // passes on the ready cluster
	got := getJob(t, rj)
	if got.Status.JobDeploymentStatus != rayv1.JobDeploymentStatusInitializing || !neverFits(got) || got.Status.DashboardURL != "" {
		t.Fatalf("a RayJob whose cluster can never fit moved on: %+v", got.Status)
	}
	if sj := submitters(t, rj.Namespace); len(sj) != 0 {
		t.Fatalf("a RayJob whose cluster can never fit has a submitter Job %s", sj[0].Name)
	}

	setClusterStatus(t, rc, func(st *rayv1.RayClusterStatus) {
		setCondition(st, "loom.dev/GPUInventory", metav1.ConditionTrue, "Fits", "every group's pod fits a node of this cluster")
	})
	got = waitJob(t, rj, "Running", deploymentStatus(rayv1.JobDeploymentStatusRunning))
	if got.Status.Reason != "" || len(submitters(t, rj.Namespace)) != 1 {
		t.Fatalf("after the verdict went: reason %q, %d submitters", got.Status.Reason, len(submitters(t, rj.Namespace)))
	}
}

// A RayJob asking Volcano for a gang gets a cluster carrying its Volcano
// labels; while the cluster's gang is held (its queue missing) the RayJob
// says so, until the queue is there. A RayJob on a cluster picked by
// clusterSelector reads that cluster's verdict too (Volcano missing under
// --gang-scheduler=volcano), then runs on it once it is up, its head
// Service KubeRay's (not in Loom's cache), the cluster left unowned.
func TestRayJobSaysItsClustersGangIsHeld(t *testing.T) {
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-gang")
	rj.Labels = map[string]string{"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": "rj-research", "ray.io/priority-class-name": "high"}
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	for k, v := range rj.Labels {
		if rc.Labels[k] != v {
			t.Fatalf("RayCluster labels %v lack the RayJob's %s=%s", rc.Labels, k, v)
		}
	}
	queueMsg := fmt.Sprintf(`PodGroup ray-%s-pg: Volcano queue "rj-research" does not exist: Volcano admits no gang to it until it is created`, rc.Name)
	setClusterStatus(t, rc, func(st *rayv1.RayClusterStatus) {
		setCondition(st, "loom.dev/GangScheduling", metav1.ConditionFalse, "QueueNotFound", queueMsg)
	})
	waitJob(t, rj, "held by its cluster's gang", func(j *rayv1.RayJob) bool {
		return j.Status.Reason == ReasonClusterGangHeld && j.Status.Message == "RayCluster "+rc.Name+"'s gang is held (QueueNotFound): "+queueMsg
	})
	warned(t, rj, ReasonClusterGangHeld)
	setClusterStatus(t, rc, func(st *rayv1.RayClusterStatus) {
		setCondition(st, "loom.dev/GangScheduling", metav1.ConditionTrue, "PodGroupCreated", "gang-scheduled by Volcano through PodGroup ray-"+rc.Name+"-pg")
	})
	waitJob(t, rj, "free of its cluster's verdict", func(j *rayv1.RayJob) bool {
		return j.Status.Reason == "" && strings.Contains(j.Status.Message, "waiting for RayCluster "+rc.Name+" to be ready")
	})

	shared := &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "rj-shared", Namespace: rj.Namespace}, Spec: *rj.Spec.RayClusterSpec.DeepCopy()}
	create(t, shared)
	const volcanoMsg = "the cluster asks for Volcano but Volcano's PodGroup CRD is not installed: no pods are created until it is"
	setClusterStatus(t, shared, func(st *rayv1.RayClusterStatus) {
		setCondition(st, "loom.dev/GangScheduling", metav1.ConditionFalse, "VolcanoNotInstalled", volcanoMsg)
		setCondition(st, "Stalled", metav1.ConditionTrue, "VolcanoNotInstalled", volcanoMsg)
	})
	sel := sampleJob(t, "ray-job.sample.yaml", rj.Namespace)
	sel.Name, sel.Spec.RayClusterSpec = "rayjob-selector", nil
	sel.Spec.ClusterSelector = map[string]string{"ray.io/cluster": shared.Name}
	create(t, sel)
	waitJob(t, sel, "held by the selected cluster's gang", func(j *rayv1.RayJob) bool {
		return j.Status.Reason == ReasonClusterGangHeld && j.Status.Message == "RayCluster rj-shared's gang is held (VolcanoNotInstalled): "+volcanoMsg
	})
	setClusterStatus(t, shared, func(st *rayv1.RayClusterStatus) {
		setCondition(st, "loom.dev/GangScheduling", metav1.ConditionTrue, "PodGroupCreated", "gang-scheduled by Volcano through PodGroup ray-rj-shared-pg")
		setCondition(st, "Stalled", metav1.ConditionFalse, rayv1.AllPodRunningAndReadyFirstTime, "nothing in the way")
	})
	bringUp(t, shared, false)
	got := waitJob(t, sel, "Running", deploymentStatus(rayv1.JobDeploymentStatusRunning))
	if got.Status.DashboardURL != "rj-shared-head-svc.rj-gang.svc.cluster.local:8265" || got.Status.Reason != "" {
		t.Fatalf("status on the selected cluster: %+v", got.Status)
	}
	if all := submitters(t, rj.Namespace); len(all) != 1 || all[0].Name != sel.Name {
		t.Fatalf("submitters %v, want only %s's", all, sel.Name)
	}
	if live := getCluster(t, shared); len(live.OwnerReferences) != 0 {
		t.Fatalf("the selected cluster got owners %v", live.OwnerReferences)
	}
}

func getCluster(t *testing.T, rc *rayv1.RayCluster) *rayv1.RayCluster {
	t.Helper()
	got := &rayv1.RayCluster{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// A Service of the RayJob-level head Service's name (<rayjob>-head-svc)
// that the RayJob does not control, such as the head Service of a
// RayCluster named as the RayJob in the same namespace, is left alone and
// does not stop the job: that Service is a convenience, not part of the
// run. The RayJob follows its Ray job to Complete, cleans up its cluster,
// and a Warning event names the Service in the way, once, not on every
// poll of the dashboard.
func TestAServiceNameTakenByAStrangerDoesNotStopTheJob(t *testing.T) {
	ctx := context.Background()
	fake := newFake(t, 3*requeueRunning)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-svc-clash")
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	rj.Spec.ShutdownAfterJobFinishes = true
	stranger := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: rj.Name + "-head-svc", Namespace: rj.Namespace}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"ray.io/cluster": rj.Name, "ray.io/node-type": "head"},
		Ports:    []corev1.ServicePort{{Name: utils.DashboardPortName, Port: 8265}},
	}}
	create(t, stranger)
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	got := waitJob(t, rj, "Complete", deploymentStatus(rayv1.JobDeploymentStatusComplete))
	if got.Status.JobStatus != rayv1.JobStatusSucceeded {
		t.Fatalf("status %+v", got.Status)
	}
	clusterGone(t, rc)
	warned(t, rj, "NameConflict")
	time.Sleep(time.Second) // the recorder sends a repeat in the background
	if evs := eventsOf(t, rj, corev1.EventTypeWarning, "NameConflict"); len(evs) != 1 || evs[0].Series != nil {
		t.Fatalf("NameConflict events %+v, want one, said once", evs)
	}
	after := &corev1.Service{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(stranger), after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != stranger.ResourceVersion || len(after.OwnerReferences) != 0 {
		t.Fatalf("the stranger's Service was touched: %+v", after.ObjectMeta)
	}
}

// The RayJob-level Service's name conflict is in the status message while
// it stands, and warned of when the stored message did not say it: a
// manager restarted with nothing changed warns of nothing new.
func TestAServiceNameConflictIsWarnedOnceAcrossARestart(t *testing.T) {
	fake := newFake(t, time.Hour)
	m := startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-svc-clash-restart")
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	create(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: rj.Name + "-head-svc", Namespace: rj.Namespace}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Name: utils.DashboardPortName, Port: 8265}}}})
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	waitJob(t, rj, "running its Ray job", func(j *rayv1.RayJob) bool { return j.Status.JobStatus == rayv1.JobStatusRunning })
	warned(t, rj, "NameConflict")
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	startManager(t, fake)
	polled := fake.Requests()
	testenv.Eventually(t, 30*time.Second, func() error {
		if fake.Requests() < polled+2 {
			return fmt.Errorf("the restarted manager has not polled the dashboard twice yet")
		}
		return nil
	})
	time.Sleep(time.Second) // the recorder sends in the background
	if evs := eventsOf(t, rj, corev1.EventTypeWarning, "NameConflict"); len(evs) != 1 || evs[0].Series != nil {
		t.Fatalf("NameConflict events %+v, want the one from before the restart", evs)
	}
	if got := getJob(t, rj); !strings.Contains(got.Status.Message, "runs without its own head Service") {
		t.Fatalf("message %q does not say the RayJob runs without its Service", got.Status.Message)
	}
}

// A Job of the submitter's name (the RayJob's) that the RayJob does not
// control is left alone; the RayJob says so in its status message and a
// Warning event, instead of failing each pass with nothing on the object,
// its observedGeneration following edits meanwhile, and goes on once that
// Job is gone.
func TestASubmitterNameTakenByAStrangerIsReported(t *testing.T) {
	ctx := context.Background()
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-job-clash")
	stranger := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: rj.Name, Namespace: rj.Namespace}, Spec: batchv1.JobSpec{
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}},
	}}
	create(t, stranger)
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	waitJob(t, rj, "saying what is in the way", func(j *rayv1.RayJob) bool {
		return strings.Contains(j.Status.Message, "Job "+rj.Namespace+"/"+rj.Name+" exists")
	})
	warned(t, rj, "NameConflict")
	// An edit while held is seen: observedGeneration follows the spec.
	updateJob(t, rj, func(j *rayv1.RayJob) { j.Spec.ActiveDeadlineSeconds = ptr.To[int32](3600) })
	waitJob(t, rj, "observing its edited spec", func(j *rayv1.RayJob) bool {
		return j.Status.ObservedGeneration == j.Generation && strings.Contains(j.Status.Message, "Job "+rj.Namespace+"/"+rj.Name+" exists")
	})
	after := &batchv1.Job{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(stranger), after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != stranger.ResourceVersion || len(after.OwnerReferences) != 0 {
		t.Fatalf("the stranger's Job was touched: %+v", after.ObjectMeta)
	}
	if err := env.Client.Delete(ctx, after, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		if sj := submitters(t, rj.Namespace); len(sj) != 1 {
			return fmt.Errorf("%d submitter Jobs once the stranger's is gone", len(sj))
		}
		return nil
	})
	waitJob(t, rj, "Running", deploymentStatus(rayv1.JobDeploymentStatusRunning))
}

// A submission the dashboard refuses (HTTPMode) is said on the RayJob: its
// status message quotes the dashboard's answer and a Warning event names
// it, instead of the RayJob reading Running with nothing said while the
// manager's log fills; once the dashboard takes it, the job is submitted
// and the message is the Ray job's.
func TestARefusedSubmissionIsReported(t *testing.T) {
	const refusal = "runtime_env: pip package torch==0.0.0 cannot be installed"
	fake := newFake(t, time.Hour)
	fake.SetRefuse(refusal)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-refused")
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	got := waitJob(t, rj, "saying the dashboard refused the submission", func(j *rayv1.RayJob) bool {
		return strings.Contains(j.Status.Message, refusal)
	})
	if !strings.Contains(got.Status.Message, "submitting Ray job "+got.Status.JobId) || got.Status.JobDeploymentStatus != rayv1.JobDeploymentStatusRunning {
		t.Fatalf("status %+v", got.Status)
	}
	warned(t, rj, ReasonFailedToSubmit)

	fake.SetRefuse("")
	got = waitJob(t, rj, "running its Ray job", func(j *rayv1.RayJob) bool { return j.Status.JobStatus == rayv1.JobStatusRunning })
	if strings.Contains(got.Status.Message, refusal) {
		t.Fatalf("the refusal is still said: %q", got.Status.Message)
	}
}

// A RayJob without an entrypoint, where Loom would submit it (HTTPMode;
// K8sJobMode with KubeRay's submitter), is ValidationFailed before any
// cluster comes up: Ray refuses such a job, after the cluster came up for
// nothing. Given one, it starts over and runs.
func TestARayJobWithoutAnEntrypointMakesNoCluster(t *testing.T) {
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-no-entrypoint")
	rj.Spec.Entrypoint = "  "
	create(t, rj)
	got := waitJob(t, rj, "ValidationFailed", deploymentStatus(rayv1.JobDeploymentStatusValidationFailed))
	if !strings.Contains(got.Status.Message, "spec.entrypoint must be set") || got.Status.RayClusterName != "" {
		t.Fatalf("status %+v", got.Status)
	}
	var list rayv1.RayClusterList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(rj.Namespace)); err != nil || len(list.Items) != 0 {
		t.Fatalf("RayClusters %d (%v), want none", len(list.Items), err)
	}
	updateJob(t, rj, func(j *rayv1.RayJob) { j.Spec.Entrypoint = "python /home/ray/samples/sample_code.py" })
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	waitJob(t, rj, "Running", deploymentStatus(rayv1.JobDeploymentStatusRunning))
}

// A running Ray job whose state does not change writes nothing: the
// dashboard's millisecond start time, kept in the status to the second as
// every metav1.Time, does not read as a change on each poll.
func TestARunningRayJobWritesNothingWhileNothingChanges(t *testing.T) {
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-idle")
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	before := waitJob(t, rj, "running its Ray job", func(j *rayv1.RayJob) bool { return j.Status.JobStatus == rayv1.JobStatusRunning })
	time.Sleep(time.Second) // the pass that wrote RUNNING is over
	writes := statusWrites(t)
	time.Sleep(3*requeueRunning + time.Second) // three polls of the dashboard
	if n := statusWrites(t) - writes; n != 0 {
		t.Fatalf("%v RayJob status writes while its Ray job ran unchanged (status %+v)", n, before.Status)
	}
}

// statusWrites is how many RayJob status writes the rayjob controller's
// writer sent (the API server keeps the resourceVersion of a write that
// changes nothing, so only the writer's count shows one).
func statusWrites(t *testing.T) float64 {
	t.Helper()
	var v float64
	for _, line := range strings.Split(gathered(t), "\n") {
		if strings.HasPrefix(line, `loom_writes_total{field_owner="loom-rayjob",kind="RayJob",operation="status",result="written"}`) {
			_, _ = fmt.Sscanf(line[strings.LastIndex(line, " ")+1:], "%g", &v)
		}
	}
	return v
}

// A RayJob past its activeDeadlineSeconds fails with DeadlineExceeded and
// stops its Ray job, as a batch Job's deadline ends its pods: the cluster
// stays (no shutdownAfterJobFinishes), and the job would run on with it.
func TestADeadlineStopsTheRayJob(t *testing.T) {
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-deadline")
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	rj.Spec.ActiveDeadlineSeconds = ptr.To[int32](10)
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	running := waitJob(t, rj, "running its Ray job", func(j *rayv1.RayJob) bool { return j.Status.JobStatus == rayv1.JobStatusRunning })
	got := waitJob(t, rj, "Failed", deploymentStatus(rayv1.JobDeploymentStatusFailed))
	if got.Status.Reason != rayv1.DeadlineExceeded {
		t.Fatalf("status %+v", got.Status)
	}
	info, err := NewHTTPDashboard(fake.URL(), DashboardTimeout).Get(context.Background(), running.Status.JobId)
	if err != nil || info.JobStatus != rayv1.JobStatusStopped {
		t.Fatalf("the Ray job of a RayJob past its deadline: %+v %v, want STOPPED", info, err)
	}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), &rayv1.RayCluster{}); err != nil {
		t.Fatalf("the cluster without shutdownAfterJobFinishes: %v", err)
	}
}

// A RayJob whose submitter Job failed after submitting (its log follower
// evicted, say) fails with SubmissionFailed and stops its Ray job, which
// would otherwise run on the cluster (kept: no shutdownAfterJobFinishes),
// followed by no one; a StoppedRayJob event says so.
func TestAFailedSubmitterStopsItsRayJob(t *testing.T) {
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-submitter-failed")
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	got := waitJob(t, rj, "Running", deploymentStatus(rayv1.JobDeploymentStatusRunning))
	var sj batchv1.Job
	testenv.Eventually(t, 10*time.Second, func() error { return env.Client.Get(context.Background(), client.ObjectKeyFromObject(rj), &sj) })
	if _, err := fake.Submit(utiltypes.RayJobRequest{SubmissionId: got.Status.JobId, Entrypoint: rj.Spec.Entrypoint}); err != nil {
		t.Fatal(err)
	}
	waitJob(t, rj, "running its Ray job", func(j *rayv1.RayJob) bool { return j.Status.JobStatus == rayv1.JobStatusRunning })
	failSubmitter(t, &sj)
	got = waitJob(t, rj, "Failed", deploymentStatus(rayv1.JobDeploymentStatusFailed))
	if got.Status.Reason != rayv1.SubmissionFailed {
		t.Fatalf("status %+v, want SubmissionFailed", got.Status)
	}
	info, err := NewHTTPDashboard(fake.URL(), DashboardTimeout).Get(context.Background(), got.Status.JobId)
	if err != nil || info.JobStatus != rayv1.JobStatusStopped {
		t.Fatalf("the Ray job of a RayJob whose submission failed: %+v %v, want STOPPED", info, err)
	}
	if evs := eventsOf(t, rj, corev1.EventTypeNormal, "StoppedRayJob"); len(evs) != 1 || !strings.Contains(evs[0].Note, "after its submitter Job failed") {
		t.Fatalf("StoppedRayJob events %+v, want one saying why", evs)
	}
}

// failSubmitter sets a submitter Job's status to Failed, as the job
// controller would once its backoffLimit was reached (FailureTarget first,
// as the API server asks).
func failSubmitter(t *testing.T, sj *batchv1.Job) {
	t.Helper()
	now := metav1.Now()
	started := metav1.NewTime(now.Add(-time.Second))
	sj.Status.StartTime, sj.Status.Failed = &started, 3
	sj.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit", LastProbeTime: now, LastTransitionTime: now},
		{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit", LastProbeTime: now, LastTransitionTime: now},
	}
	if err := env.Client.Status().Update(context.Background(), sj); err != nil {
		t.Fatal(err)
	}
}

// DeleteWorkers suspends the worker groups of the cluster as it runs: an
// edit of the RayJob's rayClusterSpec after the cluster was created, which
// is disregarded, does not reach the cluster's head then.
func TestDeleteWorkersKeepsTheClusterAsItRuns(t *testing.T) {
	fake := newFake(t, 2*time.Second)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-delete-workers")
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	rj.Spec.DeletionStrategy = &rayv1.DeletionStrategy{DeletionRules: []rayv1.DeletionRule{
		{Policy: rayv1.DeleteWorkers, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusSucceeded}}}}
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	image := rc.Spec.HeadGroupSpec.Template.Spec.Containers[0].Image
	updateJob(t, rj, func(j *rayv1.RayJob) {
		j.Spec.RayClusterSpec.HeadGroupSpec.Template.Spec.Containers[0].Image = "rayproject/ray:edited"
	})
	bringUp(t, rc, true)
	waitJob(t, rj, "Complete", deploymentStatus(rayv1.JobDeploymentStatusComplete))
	testenv.Eventually(t, 30*time.Second, func() error {
		got := getCluster(t, rc)
		if len(got.Spec.WorkerGroupSpecs) == 0 || !ptr.Deref(got.Spec.WorkerGroupSpecs[0].Suspend, false) {
			return fmt.Errorf("worker groups not suspended: %+v", got.Spec.WorkerGroupSpecs)
		}
		if img := got.Spec.HeadGroupSpec.Template.Spec.Containers[0].Image; img != image {
			t.Fatalf("the head's image became %q with DeleteWorkers, want %q as the cluster ran", img, image)
		}
		return nil
	})
}

// Under KubeRay's DELETE_RAYJOB_CR_AFTER_JOB_FINISHES, set in the
// manager's environment as in KubeRay's operator's, shutdownAfterJobFinishes
// deletes the RayJob itself ttlSecondsAfterFinished after it finished (its
// cluster owned by it, for the garbage collector), instead of the cluster
// alone; the cluster is not deleted before the TTL.
func TestDeleteRayJobCRAfterJobFinishes(t *testing.T) {
	t.Setenv(utils.DELETE_RAYJOB_CR_AFTER_JOB_FINISHES, "true")
	fake := newFake(t, 500*time.Millisecond)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-delete-cr")
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	rj.Spec.ShutdownAfterJobFinishes, rj.Spec.TTLSecondsAfterFinished = true, 2
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	waitJob(t, rj, "Complete", deploymentStatus(rayv1.JobDeploymentStatusComplete))
	if live := getCluster(t, rc); live.DeletionTimestamp != nil {
		t.Fatalf("the cluster was deleted before the TTL")
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(rj), &rayv1.RayJob{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("RayJob still there (%v)", err)
	})
	controlledBy(t, getCluster(t, rc), rj) // the garbage collector's to delete
}

// behindCache is a manager's cache that has not seen the RayJob's cluster
// and submitter Job yet.
type behindCache struct{ client.Client }

func (c behindCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	switch obj.(type) {
	case *rayv1.RayCluster, *batchv1.Job:
		return apierrors.NewNotFound(rayv1.Resource("rayclusters"), key.Name)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// A pass on a cache behind the pass that created the cluster and the
// submitter finds them made and records no second Created event.
func TestCreatedEventsOnceWhenTheCacheIsBehind(t *testing.T) {
	ctx := context.Background()
	startManager(t, newFake(t, time.Hour)) // installs the CRDs
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-created-once")
	rj.Spec.ManagedBy = ptr.To("kueue.x-k8s.io/multikueue") // the manager's reconciler leaves it to this test
	create(t, rj)
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: behindCache{env.Client}, APIReader: env.Client, Recorder: rec}
	r.writer = apply.NewWriter(r.Client, FieldOwner, apply.Options{Live: r.APIReader})
	j := normalized(getJob(t, rj))
	j.Status.JobId, j.Status.RayClusterName, j.Status.DashboardURL = "rayjob-sample-abcde", "rayjob-sample-fghij", "rayjob-sample-fghij-head-svc:8265"
	o := observed{job: j, cluster: readyCluster(), now: time.Now()}
	o.cluster.Name, o.cluster.Spec = j.Status.RayClusterName, *j.Spec.RayClusterSpec.DeepCopy()
	d := decision{status: j.Status, createCluster: true, createSubmitter: true}
	for pass := 1; pass <= 2; pass++ {
		if err := r.write(ctx, o, &d); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
	}
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	if len(got) != 2 || !strings.Contains(got[0], "CreatedRayCluster") || !strings.Contains(got[1], "CreatedRayJobSubmitter") {
		t.Fatalf("events %q, want one CreatedRayCluster and one CreatedRayJobSubmitter", got)
	}
}

// A running RayJob edited into an invalid spec holds where it is: Running,
// its cluster owned and up, its Ray job running on and followed, the
// message and an InvalidRayJobSpec Warning saying why, instead of
// ValidationFailed with its cluster and Ray job running on unfollowed.
// Mended, it follows its Ray job as before, submitted once.
func TestAnInvalidEditHoldsARunningRayJob(t *testing.T) {
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-invalid-edit")
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	running := waitJob(t, rj, "running its Ray job", func(j *rayv1.RayJob) bool { return j.Status.JobStatus == rayv1.JobStatusRunning })
	updateJob(t, rj, func(j *rayv1.RayJob) { j.Spec.TTLSecondsAfterFinished = 7 }) // without shutdownAfterJobFinishes
	got := waitJob(t, rj, "held on its invalid spec", func(j *rayv1.RayJob) bool {
		return j.Status.ObservedGeneration == j.Generation && strings.Contains(j.Status.Message, "TTLSecondsAfterFinished")
	})
	if got.Status.JobDeploymentStatus != rayv1.JobDeploymentStatusRunning || got.Status.JobStatus != rayv1.JobStatusRunning || got.Status.RayClusterName != rc.Name {
		t.Fatalf("status %+v, want Running, held", got.Status)
	}
	warned(t, rj, "InvalidRayJobSpec")
	if live := getCluster(t, rc); !metav1.IsControlledBy(live, got) || live.DeletionTimestamp != nil {
		t.Fatalf("the cluster of the held RayJob: %+v", live.ObjectMeta)
	}
	updateJob(t, rj, func(j *rayv1.RayJob) { j.Spec.TTLSecondsAfterFinished = 0 })
	got = waitJob(t, rj, "following its Ray job again", func(j *rayv1.RayJob) bool {
		return j.Status.ObservedGeneration == j.Generation && !strings.Contains(j.Status.Message, "TTLSecondsAfterFinished")
	})
	if got.Status.JobDeploymentStatus != rayv1.JobDeploymentStatusRunning || got.Status.JobStatus != rayv1.JobStatusRunning || fake.Submissions(running.Status.JobId) != 1 {
		t.Fatalf("mended: status %+v, %d submissions", got.Status, fake.Submissions(running.Status.JobId))
	}
}

// A submitter pod that cannot run (its image cannot be pulled) is quoted in
// the status of the RayJob waiting for its submission, read from the pod
// cache (envtest runs no job controller: the test makes the Job's pod as
// it would, from the Job's template). The pod is found by the Job's
// selector: here it lacks the RayJob's origin labels, as the submitter
// pods of an earlier Loom did.
func TestASubmitterPodThatCannotRunIsSaid(t *testing.T) {
	ctx := context.Background()
	fake := newFake(t, time.Hour)
	startManager(t, fake)
	rj := sampleJob(t, "ray-job.sample.yaml", "rj-submitter-pod")
	create(t, rj)
	rc, _ := waitCluster(t, rj)
	bringUp(t, rc, true)
	var sj batchv1.Job
	testenv.Eventually(t, 30*time.Second, func() error {
		if all := submitters(t, rj.Namespace); len(all) == 1 {
			sj = all[0]
			return nil
		}
		return fmt.Errorf("no submitter Job yet")
	})
	labels := map[string]string{}
	for k, v := range sj.Spec.Template.Labels {
		if !strings.HasPrefix(k, "ray.io/originated-from") {
			labels[k] = v
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sj.Name + "-x7k2p", Namespace: sj.Namespace, Labels: labels,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(&sj, batchv1.SchemeGroupVersion.WithKind("Job"))}},
		Spec: *sj.Spec.Template.Spec.DeepCopy()}
	pod.Spec.NodeName = "node-1"
	create(t, pod)
	const pull = `Back-off pulling image "rayproject/ray:2.46.0"`
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: pod.Spec.Containers[0].Name, Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: pull}}}}
	if err := env.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	waitJob(t, rj, "quoting its submitter pod", func(j *rayv1.RayJob) bool {
		return strings.Contains(j.Status.Message, "waiting for the submitter Job") &&
			strings.HasSuffix(j.Status.Message, "pod "+pod.Name+" container "+pod.Spec.Containers[0].Name+" waits: ImagePullBackOff: "+pull)
	})
}

// A RayCluster picked by clusterSelector that is deleted and created again
// under its name while the RayJob runs on it (here while the manager is
// down, so no pass sees the gap) is not the attempt's: the RayJob fails,
// saying so, and its Ray job is not submitted to the new cluster, which
// would run it a second time.
func TestASelectedClusterCreatedAgainIsNotTheAttempts(t *testing.T) {
	fake := newFake(t, time.Hour)
	m := startManager(t, fake)
	rj := sampleJob(t, "ray-job.use-existing-raycluster.yaml", "rj-replaced")
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	rc, err := testenv.KubeRaySample("ray-cluster.sample.yaml", rj.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	rc.Name = rj.Spec.ClusterSelector[utils.RayJobClusterSelectorKey]
	first := rc.DeepCopy()
	create(t, first)
	bringUp(t, first, false)
	create(t, rj)
	got := waitJob(t, rj, "running its Ray job", func(j *rayv1.RayJob) bool { return j.Status.JobStatus == rayv1.JobStatusRunning })
	if got.Annotations[AnnotationClusterUID] != string(first.UID) {
		t.Fatalf("annotation %s = %q, want the cluster's UID %s", AnnotationClusterUID, got.Annotations[AnnotationClusterUID], first.UID)
	}
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := env.Client.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	clusterGone(t, first)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: first.Name + "-head-svc", Namespace: first.Namespace}}
	if err := env.Client.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	second := rc.DeepCopy()
	create(t, second)
	bringUp(t, second, false)

	fresh := newFake(t, time.Hour) // the new cluster's dashboard has no job
	startManager(t, fresh)
	got = waitJob(t, rj, "failed", deploymentStatus(rayv1.JobDeploymentStatusFailed))
	if !strings.Contains(got.Status.Message, "was deleted and created again (UID "+string(first.UID)+", now "+string(second.UID)+")") {
		t.Fatalf("message %q does not say the cluster was created again", got.Status.Message)
	}
	time.Sleep(time.Second)
	if n := fresh.Submissions(got.Status.JobId); n != 0 {
		t.Fatalf("Ray job %s submitted %d times to the new cluster", got.Status.JobId, n)
	}
}
