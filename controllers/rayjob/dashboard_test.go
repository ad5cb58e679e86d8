package rayjob

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	"github.com/loom-dev/loom/controllers/rayjob/rayfake"
)

// The HTTP client against the fake dashboard: a job's whole life, a
// duplicate submission, an unknown id, a stop, logs, and a dashboard down.
func TestHTTPDashboardAgainstFake(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	fake := rayfake.New()
	defer fake.Close()
	fake.Now = func() time.Time { return now }
	fake.PendingFor, fake.RunFor = time.Second, 2*time.Second
	d := NewHTTPDashboard(strings.TrimPrefix(fake.URL(), "http://"), time.Second)
	ctx := context.Background()

	if _, err := d.Get(ctx, "nope"); !errors.Is(err, ErrJobNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	id, err := d.Submit(ctx, &utiltypes.RayJobRequest{SubmissionId: "ok-1", Entrypoint: "python ok.py"})
	if err != nil || id != "ok-1" {
		t.Fatalf("submit: %q %v", id, err)
	}
	if _, err := d.Submit(ctx, &utiltypes.RayJobRequest{SubmissionId: "ok-1", Entrypoint: "python ok.py"}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("duplicate submit: %v", err)
	}
	if _, err := d.Submit(ctx, &utiltypes.RayJobRequest{SubmissionId: "bad-1", Entrypoint: `bash -c "exit 1"`}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Submit(ctx, &utiltypes.RayJobRequest{SubmissionId: "stop-1", Entrypoint: "sleep 100"}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		at      time.Duration
		ok, bad rayv1.JobStatus
	}{
		{0, rayv1.JobStatusPending, rayv1.JobStatusPending},
		{1500 * time.Millisecond, rayv1.JobStatusRunning, rayv1.JobStatusRunning},
		{3 * time.Second, rayv1.JobStatusSucceeded, rayv1.JobStatusFailed},
	} {
		now = time.Unix(1_700_000_000, 0).Add(step.at)
		if step.at == 1500*time.Millisecond {
			if err := d.Stop(ctx, "stop-1"); err != nil {
				t.Fatal(err)
			}
		}
		for id, want := range map[string]rayv1.JobStatus{"ok-1": step.ok, "bad-1": step.bad} {
			info, err := d.Get(ctx, id)
			if err != nil || info.JobStatus != want || info.SubmissionId != id {
				t.Fatalf("at %s %s: %+v %v, want %s", step.at, id, info, err, want)
			}
		}
	}
	if info, _ := d.Get(ctx, "stop-1"); info.JobStatus != rayv1.JobStatusStopped || info.EndTime == 0 {
		t.Fatalf("stopped job: %+v", info)
	}
	if info, _ := d.Get(ctx, "bad-1"); !strings.Contains(info.Message, "exit code 1") {
		t.Fatalf("failed job's message: %q", info.Message)
	}
	logs, err := d.Logs(ctx, "bad-1")
	if err != nil || !strings.Contains(logs, "exited with code 1") {
		t.Fatalf("logs: %q %v", logs, err)
	}
	if err := d.Stop(ctx, "ok-1"); err != nil {
		t.Fatalf("stopping a finished job: %v", err)
	}
	if fake.Submissions("ok-1") != 2 || len(fake.JobIDs()) != 3 {
		t.Fatalf("submissions %d, jobs %v", fake.Submissions("ok-1"), fake.JobIDs())
	}
	fake.SetDown(true)
	if _, err := d.Get(ctx, "ok-1"); err == nil || errors.Is(err, ErrJobNotFound) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("dashboard down: %v", err)
	}
}

func TestHTTPDashboardUnreachable(t *testing.T) {
	fake := rayfake.New()
	url := fake.URL()
	fake.Close()
	d := NewHTTPDashboard(url, 200*time.Millisecond)
	start := time.Now()
	if _, err := d.Get(context.Background(), "x"); err == nil || errors.Is(err, ErrJobNotFound) {
		t.Fatalf("closed dashboard: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("the request outlived its timeout")
	}
}

// Stopping the Ray job of a RayJob that gives up on it says what happened:
// a StoppedRayJob event naming why, a FailedToStopRayJob Warning with the
// dashboard's error, and nothing for a job the dashboard never had (the
// submitter failed before submitting).
func TestStopJobSaysWhatHappened(t *testing.T) {
	fake := rayfake.New()
	defer fake.Close()
	if _, err := fake.Submit(utiltypes.RayJobRequest{SubmissionId: "running", Entrypoint: "python x.py"}); err != nil {
		t.Fatal(err)
	}
	job := &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "rj", Namespace: "ns"}}
	for _, tc := range []struct {
		id   string
		down bool
		want string
	}{
		{"running", false, "Normal StoppedRayJob Stopped Ray job running after its submitter Job failed on RayCluster rc"},
		{"never-submitted", false, ""},
		{"running", true, "Warning FailedToStopRayJob Could not stop Ray job running after its submitter Job failed on RayCluster rc"},
	} {
		fake.SetDown(tc.down)
		rec := events.NewFakeRecorder(10)
		r := &Reconciler{Recorder: rec, DashboardFor: func(a string) Dashboard { return NewHTTPDashboard(a, DashboardTimeout) }}
		d := &decision{status: rayv1.RayJobStatus{JobId: tc.id, DashboardURL: fake.URL(), RayClusterName: "rc"}}
		r.stopJob(context.Background(), job, d, "after its submitter Job failed", time.Now())
		close(rec.Events)
		got := ""
		for e := range rec.Events {
			got += e
		}
		if !strings.HasPrefix(got, tc.want) || (tc.want == "" && got != "") {
			t.Errorf("stopping %s (dashboard down %v): events %q, want %q", tc.id, tc.down, got, tc.want)
		}
	}
}

// A stop that fails is tried again with backoff, up to stopTries times:
// the first failure and the last are Warnings (not every try), the
// message says how many failed and when the next is; once the dashboard
// answers, the job is STOPPED, said once, and not asked of again.
func TestAFailedStopIsTriedAgain(t *testing.T) {
	fake := rayfake.New()
	defer fake.Close()
	if _, err := fake.Submit(utiltypes.RayJobRequest{SubmissionId: "running", Entrypoint: "python x.py"}); err != nil {
		t.Fatal(err)
	}
	job := &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "rj", Namespace: "ns"}}
	rec := events.NewFakeRecorder(50)
	r := &Reconciler{Recorder: rec, DashboardFor: func(a string) Dashboard { return NewHTTPDashboard(a, DashboardTimeout) }}
	st := rayv1.RayJobStatus{JobId: "running", DashboardURL: fake.URL(), RayClusterName: "rc", JobStatus: rayv1.JobStatusRunning,
		JobDeploymentStatus: rayv1.JobDeploymentStatusFailed, Message: "The RayJob has passed the activeDeadlineSeconds."}
	now := time.Now()
	pass := func(at time.Duration) *decision {
		d := &decision{status: st}
		r.stopJob(context.Background(), job, d, "past the activeDeadlineSeconds", now.Add(at))
		st = d.status
		return d
	}
	fake.SetDown(true)
	d := pass(0)
	if !strings.HasPrefix(st.Message, "The RayJob has passed the activeDeadlineSeconds.; stopping Ray job running failed (1 of 8 tries)") ||
		!strings.HasSuffix(st.Message, "trying again in 1s") || d.requeue != time.Second {
		t.Fatalf("after a failed stop: message %q, requeue %v", st.Message, d.requeue)
	}
	if d := pass(500 * time.Millisecond); d.requeue != 500*time.Millisecond || !strings.Contains(st.Message, "(1 of 8 tries)") {
		t.Fatalf("a pass before the next try: message %q, requeue %v; want no try, looked at again then", st.Message, d.requeue)
	}
	at := time.Second
	for i := 2; i <= stopTries; i++ {
		pass(at)
		at += dashboardBackoff(i)
	}
	if !strings.HasSuffix(st.Message, "Loom tries no more") || !strings.Contains(st.Message, "failed 8 times") || strings.Count(st.Message, "stopping Ray job") != 1 {
		t.Fatalf("after %d failed stops: message %q", stopTries, st.Message)
	}
	fake.SetDown(false)
	pass(time.Hour) // given up: not asked again
	if info, _ := NewHTTPDashboard(fake.URL(), DashboardTimeout).Get(context.Background(), "running"); info == nil || info.JobStatus == rayv1.JobStatusStopped {
		t.Fatalf("a stop given up on was tried again: %+v", info)
	}
	close(rec.Events)
	var warnings []string
	for e := range rec.Events {
		warnings = append(warnings, e)
	}
	if len(warnings) != 2 || !strings.Contains(warnings[0], "trying again in 1s, up to 8 times") || !strings.Contains(warnings[1], "gave up after 8 tries") {
		t.Fatalf("events %q, want the first failure and the last", warnings)
	}

	// Another Ray job (a new attempt's), its stop failing once, then going through.
	rec = events.NewFakeRecorder(50)
	r.Recorder = rec
	if _, err := fake.Submit(utiltypes.RayJobRequest{SubmissionId: "again", Entrypoint: "python x.py"}); err != nil {
		t.Fatal(err)
	}
	st.JobId, st.JobStatus, st.Message = "again", rayv1.JobStatusRunning, "deadline"
	fake.SetDown(true)
	pass(2 * time.Hour)
	fake.SetDown(false)
	pass(2*time.Hour + time.Second)
	if st.JobStatus != rayv1.JobStatusStopped || st.Message != "deadline" {
		t.Fatalf("after a stop that went through: %q %q, want STOPPED, the note gone", st.JobStatus, st.Message)
	}
	pass(3 * time.Hour)
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	if len(got) != 2 || !strings.HasPrefix(got[1], "Normal StoppedRayJob") {
		t.Fatalf("events %q, want one Warning then one StoppedRayJob", got)
	}
}
