package rayjob

import (
	"context"
	"errors"
	"strings"
	"testing"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
)

// downDashboard answers every stop with err (connection refused when
// nil), counting them.
type downDashboard struct {
	stops int
	err   error
}

func (d *downDashboard) Submit(context.Context, *utiltypes.RayJobRequest) (string, error) {
	return "", errors.New("down")
}
func (d *downDashboard) Get(context.Context, string) (*utiltypes.RayJobInfo, error) {
	return nil, errors.New("down")
}
func (d *downDashboard) Stop(context.Context, string) error {
	d.stops++
	if d.err != nil {
		return d.err
	}
	return errors.New("connection refused")
}
func (d *downDashboard) Logs(context.Context, string) (string, error) {
	return "", errors.New("down")
}

// A manager that starts (its memory empty) takes the count of failed
// stops up from the RayJob's message, which says it after each failure:
// the tries stay at stopTries in all across restarts, one that gave up
// does not try again, and only the count of the Ray job the status names
// is taken.
func TestFailedStopsAreCountedAcrossARestart(t *testing.T) {
	failed := "The RayJob has passed the activeDeadlineSeconds."
	tests := []struct {
		name      string
		stored    string
		wantStops int
		want      string
	}{
		{"none failed yet", failed, 1, failed + stopNote + "rj-abcde failed (1 of 8 tries)"},
		{"seven failed before the restart", failed + stopNote + "rj-abcde failed (7 of 8 tries): connection refused; trying again in 1m0s",
			1, failed + stopNote + "rj-abcde failed 8 times, the last: connection refused; Loom tries no more"},
		{"three failed before the restart", failed + stopNote + "rj-abcde failed (3 of 8 tries): connection refused; trying again in 4s",
			1, failed + stopNote + "rj-abcde failed (4 of 8 tries)"},
		{"gave up before the restart", failed + stopNote + "rj-abcde failed 8 times, the last: connection refused; Loom tries no more",
			0, failed + stopNote + "rj-abcde failed 8 times"},
		{"another Ray job's tries", failed + stopNote + "rj-other failed (7 of 8 tries): connection refused; trying again in 1m0s",
			1, failed + stopNote + "rj-abcde failed (1 of 8 tries)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dash := &downDashboard{}
			r := &Reconciler{DashboardFor: func(string) Dashboard { return dash }}
			j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusFailed)
			j.Status.DashboardURL, j.Status.Message = "rj-fghij-head-svc.ns.svc.cluster.local:8265", tt.stored
			d := decision{status: *j.Status.DeepCopy()}
			r.stopJob(context.Background(), j, &d, "past the activeDeadlineSeconds", t0)
			if dash.stops != tt.wantStops || !strings.HasPrefix(d.status.Message, tt.want) {
				t.Fatalf("%d stops, message %q; want %d, %q", dash.stops, d.status.Message, tt.wantStops, tt.want)
			}
		})
	}
}

// A stop the dashboard answers that it does not know the job (gone with
// its head, or never submitted) is the last: the message no longer says
// a failed stop is tried again.
func TestAStopOfAJobTheDashboardLacksEndsTheTries(t *testing.T) {
	failed := "The RayJob has passed the activeDeadlineSeconds."
	dash := &downDashboard{err: ErrJobNotFound}
	r := &Reconciler{DashboardFor: func(string) Dashboard { return dash }}
	j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusFailed)
	j.Status.DashboardURL = "rj-fghij-head-svc.ns.svc.cluster.local:8265"
	j.Status.Message = failed + stopNote + "rj-abcde failed (3 of 8 tries): connection refused; trying again in 4s"
	d := decision{status: *j.Status.DeepCopy()}
	r.stopJob(context.Background(), j, &d, "past the activeDeadlineSeconds", t0)
	if dash.stops != 1 || d.status.Message != failed {
		t.Fatalf("%d stops, message %q; want 1, %q", dash.stops, d.status.Message, failed)
	}
	r.stopJob(context.Background(), j, &d, "past the activeDeadlineSeconds", t0)
	if dash.stops != 1 {
		t.Fatalf("asked again after the dashboard said it lacks the job: %d stops", dash.stops)
	}
}
