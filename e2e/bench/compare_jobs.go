package bench

import (
	"context"
	"fmt"
)

// gangShape is a gang-like scenario's jobs: jobs jobs of pods pods each
// (1 master + pods-1 workers, 1 GPU a pod).
type gangShape struct{ jobs, pods int }

func (s gangShape) total() int { return s.jobs * s.pods }

// job is job i's name: the one gang is "gang", as before there were more.
func (s gangShape) job(i int) string {
	if s.jobs == 1 {
		return "gang"
	}
	return fmt.Sprintf("job-%d", i)
}

// pod is the floor's pod i of total(): job-3-5 is job 3's pod 5.
func (s gangShape) pod(i int) string { return fmt.Sprintf("%s-%d", s.job(i/s.pods), i%s.pods) }

// jobsPerJob is the jobs scenario's pods a job: 1 master + 7 workers, one
// 8-GPU node's worth.
const jobsPerJob = 8

// jobsRun is the jobs scenario for one contender on a fresh env: Jobs jobs
// of 1 master + 7 workers submitted at once on as many 8-GPU nodes, many
// small gangs where the gang scenario has one large one.
func (r *CompareReport) jobsRun(ctx context.Context, env *Env, name string) (CompareRun, error) {
	return r.podsRun(ctx, env, name, gangShape{jobs: r.Config.Jobs, pods: jobsPerJob})
}
