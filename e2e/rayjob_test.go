package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/controllers/rayjob"
	"github.com/loom-dev/loom/controllers/rayjob/rayfake"
	"github.com/loom-dev/loom/e2e/framework"
)

// rayJobSample reads KubeRay's sample file: its RayJob and, if the file has
// one, its ConfigMap.
func rayJobSample(t *testing.T, file, ns string) (*rayv1.RayJob, *corev1.ConfigMap) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ray-project/kuberay/ray-operator").Output()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "config", "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(b), "\n---\n")
	rj := &rayv1.RayJob{}
	if err := yaml.Unmarshal([]byte(docs[0]), rj); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	rj.Namespace = ns
	var cm *corev1.ConfigMap
	if len(docs) > 1 {
		cm = &corev1.ConfigMap{}
		if err := yaml.Unmarshal([]byte(docs[1]), cm); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		cm.Namespace = ns
	}
	return rj, cm
}

func startRayJobManager(t *testing.T, fake *rayfake.Server) *framework.Manager {
	t.Helper()
	ctx := context.Background()
	rel, err := cluster.InstallChart(ctx, "loom", loomNS)
	if err != nil {
		t.Fatal(err)
	}
	m, err := cluster.RunManagerEnv(ctx, loomBin, rel, []string{rayjob.EnvDashboardOverride + "=" + fake.URL()}, "--gang-scheduler=none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop(20 * time.Second) })
	if err := cluster.WaitReady(ctx, m, loomNS, "loom-manager", 90*time.Second); err != nil {
		t.Fatal(err)
	}
	return m
}

// seenClusters records every RayCluster a RayJob had, by RayJob name.
type seenClusters struct {
	mu    sync.Mutex
	names map[string][]string
}

func (s *seenClusters) of(rayJob string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.names[rayJob])
}

// playSubmitters does what the submitter Job's `ray job submit` would do on
// a real cluster (kwok runs no container): for every submitter Job of a
// RayJob, it submits the RayJob's entrypoint under the Job's
// RAY_JOB_SUBMISSION_ID, once.
// It also records the clusters each RayJob had.
func playSubmitters(ctx context.Context, t *testing.T, fake *rayfake.Server, ns string, seen *seenClusters) {
	for ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		var rcs rayv1.RayClusterList
		if err := cluster.Client.List(ctx, &rcs, client.InNamespace(ns)); err == nil {
			seen.mu.Lock()
			for _, rc := range rcs.Items {
				owner := rc.Labels["ray.io/originated-from-cr-name"]
				if owner != "" && !slices.Contains(seen.names[owner], rc.Name) {
					seen.names[owner] = append(seen.names[owner], rc.Name)
				}
			}
			seen.mu.Unlock()
		}
		var jobs batchv1.JobList
		if err := cluster.Client.List(ctx, &jobs, client.InNamespace(ns), client.MatchingLabels{"ray.io/originated-from-crd": "RayJob"}); err != nil {
			continue
		}
		for _, j := range jobs.Items {
			id := ""
			for _, e := range j.Spec.Template.Spec.Containers[0].Env {
				if e.Name == "RAY_JOB_SUBMISSION_ID" {
					id = e.Value
				}
			}
			rj := &rayv1.RayJob{}
			if id == "" || fake.Submissions(id) > 0 || cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: j.Labels["ray.io/originated-from-cr-name"]}, rj) != nil {
				continue
			}
			if _, err := fake.Submit(utiltypes.RayJobRequest{SubmissionId: id, Entrypoint: rj.Spec.Entrypoint}); err != nil {
				t.Logf("submitter of %s: %v", rj.Name, err)
			}
		}
	}
}

func getRayJob(t *testing.T, rj *rayv1.RayJob) *rayv1.RayJob {
	t.Helper()
	got := &rayv1.RayJob{}
	if err := cluster.Client.Get(context.Background(), client.ObjectKeyFromObject(rj), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// waitRayJob waits until done says the RayJob is where it should be,
// returning every job status and cluster name it went through.
func waitRayJob(t *testing.T, rj *rayv1.RayJob, timeout time.Duration, done func(*rayv1.RayJob) bool) (*rayv1.RayJob, []rayv1.JobStatus, []string) {
	t.Helper()
	var statuses []rayv1.JobStatus
	var clusters []string
	var got *rayv1.RayJob
	eventually(t, timeout, func() (bool, string) {
		got = getRayJob(t, rj)
		if s := got.Status.JobStatus; s != "" && !slices.Contains(statuses, s) {
			statuses = append(statuses, s)
		}
		if c := got.Status.RayClusterName; c != "" && !slices.Contains(clusters, c) {
			clusters = append(clusters, c)
		}
		return done(got), fmt.Sprintf("%s: status %+v", rj.Name, got.Status)
	})
	return got, statuses, clusters
}

func clusterExists(t *testing.T, ns, name string) (*rayv1.RayCluster, bool) {
	t.Helper()
	rc := &rayv1.RayCluster{}
	err := cluster.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, rc)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return rc, rc.DeletionTimestamp == nil
}

func complete(s rayv1.JobDeploymentStatus) func(*rayv1.RayJob) bool {
	return func(j *rayv1.RayJob) bool { return j.Status.JobDeploymentStatus == s }
}

// KubeRay's RayJobs on the simulated cluster, the Ray dashboard played by
// an in-process fake: the sample (K8sJobMode) runs to SUCCEEDED and its
// cluster goes after the TTL; a failing job retries once on a new cluster
// and fails with the reason; HTTPMode submits once across a manager
// restart; a clusterSelector job runs on an existing cluster and leaves it.
func TestRayJob(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake := rayfake.New()
	fake.PendingFor, fake.RunFor = time.Second, 6*time.Second
	defer fake.Close()
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "rayjob-node", Count: 4}); err != nil {
		t.Fatal(err)
	}
	m := startRayJobManager(t, fake)
	ns := "rayjob-team"
	if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	seen := &seenClusters{names: map[string][]string{}}
	go playSubmitters(ctx, t, fake, ns, seen)

	// The sample, K8sJobMode, with shutdownAfterJobFinishes and a TTL.
	sample, cm := rayJobSample(t, "ray-job.sample.yaml", ns)
	sample.Spec.ShutdownAfterJobFinishes, sample.Spec.TTLSecondsAfterFinished = true, 5
	if err := cluster.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.Create(ctx, sample); err != nil {
		t.Fatal(err)
	}
	// A failing entrypoint with one retry.
	failing := sample.DeepCopy()
	failing.ResourceVersion, failing.Name = "", "rayjob-fails"
	failing.Spec.Entrypoint = `bash -c "exit 1"`
	failing.Spec.ShutdownAfterJobFinishes, failing.Spec.TTLSecondsAfterFinished = false, 0
	failing.Spec.BackoffLimit = ptr.To[int32](1)
	if err := cluster.Client.Create(ctx, failing); err != nil {
		t.Fatal(err)
	}

	got, _, _ := waitRayJob(t, sample, 120*time.Second, func(j *rayv1.RayJob) bool {
		return j.Status.JobDeploymentStatus == rayv1.JobDeploymentStatusRunning
	})
	checkSubmitter(t, got)
	if rc, ok := clusterExists(t, ns, got.Status.RayClusterName); !ok || !metav1.IsControlledBy(rc, got) {
		t.Fatalf("RayCluster %s of the sample missing or not owned by it", got.Status.RayClusterName)
	}
	got, statuses, _ := waitRayJob(t, sample, 60*time.Second, complete(rayv1.JobDeploymentStatusComplete))
	if got.Status.JobStatus != rayv1.JobStatusSucceeded || !slices.Contains(statuses, rayv1.JobStatusRunning) || ptr.Deref(got.Status.Succeeded, 0) != 1 {
		t.Fatalf("sample: job statuses %v, final %+v", statuses, got.Status)
	}
	if got.Status.EndTime == nil || got.Status.StartTime == nil || got.Status.DashboardURL == "" {
		t.Errorf("sample: times or dashboardURL missing: %+v", got.Status)
	}
	deadline := got.Status.EndTime.Add(5 * time.Second)
	if _, ok := clusterExists(t, ns, got.Status.RayClusterName); !ok && time.Now().Before(deadline.Add(-time.Second)) {
		t.Fatalf("sample: the cluster was deleted before ttlSecondsAfterFinished")
	}
	eventually(t, 40*time.Second, func() (bool, string) {
		_, ok := clusterExists(t, ns, got.Status.RayClusterName)
		return !ok, "the sample's cluster is still there after the TTL"
	})
	if time.Now().Before(deadline) {
		t.Errorf("sample: cluster deleted before the TTL had passed")
	}

	fails, _, _ := waitRayJob(t, failing, 180*time.Second, complete(rayv1.JobDeploymentStatusFailed))
	clusters := seen.of(failing.Name)
	var ids []string
	for _, id := range fake.JobIDs() {
		if strings.HasPrefix(id, "rayjob-fails-") {
			ids = append(ids, id)
		}
	}
	if ptr.Deref(fails.Status.Failed, 0) != 2 || fails.Status.Reason != rayv1.AppFailed || fails.Status.JobStatus != rayv1.JobStatusFailed ||
		len(clusters) != 2 || len(ids) != 2 || !strings.Contains(fails.Status.Message, "exit code 1") {
		t.Fatalf("failing job: clusters %v, Ray jobs %v, status %+v", clusters, ids, fails.Status)
	}

	testHTTPModeRestart(t, m, fake, sample)
	testClusterSelector(t, fake, ns)
}

func checkSubmitter(t *testing.T, rj *rayv1.RayJob) {
	t.Helper()
	sj := &batchv1.Job{}
	if err := cluster.Client.Get(context.Background(), client.ObjectKeyFromObject(rj), sj); err != nil {
		t.Fatalf("the sample's submitter Job: %v", err)
	}
	c := sj.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if !metav1.IsControlledBy(sj, rj) || c.Image != "rayproject/ray:2.46.0" || !strings.Contains(args, "ray job submit --address http://"+rj.Status.DashboardURL) ||
		!strings.Contains(args, "--submission-id "+rj.Status.JobId) || !strings.Contains(args, "-- python /home/ray/samples/sample_code.py") ||
		env["RAY_DASHBOARD_ADDRESS"] != rj.Status.DashboardURL || env["RAY_JOB_SUBMISSION_ID"] != rj.Status.JobId || env["PYTHONUNBUFFERED"] != "1" ||
		ptr.Deref(sj.Spec.BackoffLimit, 0) != 2 {
		t.Fatalf("submitter Job: image %s command %v args %q env %v backoffLimit %v", c.Image, c.Command, args, env, sj.Spec.BackoffLimit)
	}
}

// testHTTPModeRestart: Loom submits an HTTPMode job itself; a manager
// restart while it runs does not submit it again.
func testHTTPModeRestart(t *testing.T, m *framework.Manager, fake *rayfake.Server, sample *rayv1.RayJob) {
	ctx := context.Background()
	rj := sample.DeepCopy()
	rj.ResourceVersion, rj.Name = "", "rayjob-http"
	rj.Spec.SubmissionMode = rayv1.HTTPMode
	rj.Spec.ShutdownAfterJobFinishes, rj.Spec.TTLSecondsAfterFinished = true, 0
	if err := cluster.Client.Create(ctx, rj); err != nil {
		t.Fatal(err)
	}
	got, _, _ := waitRayJob(t, rj, 120*time.Second, func(j *rayv1.RayJob) bool {
		return j.Status.JobId != "" && fake.Submissions(j.Status.JobId) == 1
	})
	id := got.Status.JobId
	m.Stop(20 * time.Second)
	startRayJobManager(t, fake)
	got, _, _ = waitRayJob(t, rj, 60*time.Second, complete(rayv1.JobDeploymentStatusComplete))
	var ids []string
	for _, j := range fake.JobIDs() {
		if strings.HasPrefix(j, "rayjob-http-") {
			ids = append(ids, j)
		}
	}
	if got.Status.JobStatus != rayv1.JobStatusSucceeded || got.Status.JobId != id || fake.Submissions(id) != 1 || len(ids) != 1 {
		t.Fatalf("HTTPMode: job %s submitted %d times, Ray jobs %v, status %+v", id, fake.Submissions(id), ids, got.Status)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		_, ok := clusterExists(t, rj.Namespace, got.Status.RayClusterName)
		return !ok, "HTTPMode: cluster still there after the job"
	})
}

// testClusterSelector: KubeRay's use-existing-raycluster sample runs on a
// RayCluster the user made and leaves it running.
func testClusterSelector(t *testing.T, fake *rayfake.Server, ns string) {
	ctx := context.Background()
	rj, _ := rayJobSample(t, "ray-job.use-existing-raycluster.yaml", ns)
	rc := kuberaySample(t, "ray-cluster.sample.yaml", ns)
	rc.Name = rj.Spec.ClusterSelector["ray.io/cluster"]
	if err := cluster.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, func() (bool, string) {
		got, _ := clusterExists(t, ns, rc.Name)
		return got != nil && got.Status.State == rayv1.Ready, "existing cluster not ready"
	})
	if err := cluster.Client.Create(ctx, rj); err != nil {
		t.Fatal(err)
	}
	got, _, _ := waitRayJob(t, rj, 90*time.Second, complete(rayv1.JobDeploymentStatusComplete))
	if got.Status.RayClusterName != rc.Name || got.Status.JobStatus != rayv1.JobStatusSucceeded || fake.Submissions(got.Status.JobId) != 1 {
		t.Fatalf("clusterSelector job: status %+v, submitted %d times", got.Status, fake.Submissions(got.Status.JobId))
	}
	time.Sleep(3 * time.Second)
	cur, ok := clusterExists(t, ns, rc.Name)
	if !ok || len(cur.OwnerReferences) != 0 {
		t.Fatalf("the selected cluster was deleted or taken over: %+v", cur)
	}
	if cur.Status.State != rayv1.Ready {
		t.Fatalf("the selected cluster is %q after the job", cur.Status.State)
	}
}
