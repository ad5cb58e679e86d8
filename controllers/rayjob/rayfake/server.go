// Package rayfake is an in-process Ray dashboard for tests: it serves the
// Jobs REST API (POST /api/jobs/, GET /api/jobs/{id}, POST
// /api/jobs/{id}/stop, GET /api/jobs/{id}/logs) and plays each job's life
// on the clock: PENDING for PendingFor, RUNNING for RunFor, then SUCCEEDED,
// or FAILED when the entrypoint asks to fail ("exit 1", "sys.exit(1)"), or
// STOPPED once stopped. It counts submissions per submission id, so a test
// can check that a job was submitted exactly once.
package rayfake

import (
	"fmt"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
)

// Server is a fake Ray dashboard.
type Server struct {
	// PendingFor and RunFor are how long a job stays PENDING, then RUNNING.
	PendingFor, RunFor time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu       sync.Mutex
	jobs     map[string]*job
	submits  map[string]int
	down     bool
	refuse   string
	requests int
	srv      *httptest.Server
}

type job struct {
	req       utiltypes.RayJobRequest
	submitted time.Time
	stoppedAt time.Time
}

// New starts a fake dashboard on a local port.
func New() *Server {
	s := &Server{PendingFor: time.Second, RunFor: 3 * time.Second, jobs: map[string]*job{}, submits: map[string]int{}}
	s.srv = httptest.NewServer(s.Handler())
	return s
}

// URL is the dashboard's address (http://127.0.0.1:port).
func (s *Server) URL() string { return s.srv.URL }

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// SetDown makes every request answer 503 (true) or be served again (false).
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// SetRefuse makes every submission answer 400 with msg, as a dashboard
// refusing the job would ("": accept them again).
func (s *Server) SetRefuse(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = msg
}

// Submissions is how many times id was submitted (accepted or not).
func (s *Server) Submissions(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.submits[id]
}

// Requests is how many requests the server has answered.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// JobIDs lists the submission ids the dashboard knows, sorted.
func (s *Server) JobIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.jobs))
	for id := range s.jobs {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Submit submits req as `ray job submit` would; an id already known is an
// error, as in Ray.
func (s *Server) Submit(req utiltypes.RayJobRequest) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.SubmissionId == "" {
		req.SubmissionId = fmt.Sprintf("raysubmit_%d", len(s.jobs)+1)
	}
	s.submits[req.SubmissionId]++
	if strings.TrimSpace(req.Entrypoint) == "" {
		return "", fmt.Errorf("entrypoint must be set")
	}
	if s.refuse != "" {
		return "", fmt.Errorf("%s", s.refuse)
	}
	if _, ok := s.jobs[req.SubmissionId]; ok {
		return "", fmt.Errorf("job with submission_id %s already exists, please use a different submission_id", req.SubmissionId)
	}
	s.jobs[req.SubmissionId] = &job{req: req, submitted: s.now()}
	return req.SubmissionId, nil
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Fails reports whether the fake fails a job with this entrypoint.
func Fails(entrypoint string) bool {
	return strings.Contains(entrypoint, "exit 1") || strings.Contains(entrypoint, "sys.exit(1)")
}

// info is the job's details at now (call with mu held).
func (s *Server) info(id string, j *job, now time.Time) utiltypes.RayJobInfo {
	ms := func(t time.Time) uint64 { return uint64(t.UnixMilli()) } //nolint:gosec // wall-clock milliseconds are positive
	out := utiltypes.RayJobInfo{SubmissionId: id, JobId: "02000000", Entrypoint: j.req.Entrypoint, Metadata: j.req.Metadata,
		RuntimeEnv: j.req.RuntimeEnv, StartTime: ms(j.submitted)}
	running := j.submitted.Add(s.PendingFor)
	done := running.Add(s.RunFor)
	switch {
	case !j.stoppedAt.IsZero() && j.stoppedAt.Before(done):
		out.JobStatus, out.Message, out.EndTime = rayv1.JobStatusStopped, "Job was intentionally stopped.", ms(j.stoppedAt)
	case now.Before(running):
		out.JobStatus, out.Message = rayv1.JobStatusPending, "Job has not started yet. It may be waiting for resources (CPUs, GPUs, memory, custom resources) to become available."
	case now.Before(done):
		out.JobStatus, out.Message = rayv1.JobStatusRunning, "Job is currently running."
	case Fails(j.req.Entrypoint):
		out.JobStatus, out.EndTime = rayv1.JobStatusFailed, ms(done)
		out.Message = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n" + s.logs(j, now)
	default:
		out.JobStatus, out.Message, out.EndTime = rayv1.JobStatusSucceeded, "Job finished successfully.", ms(done)
	}
	return out
}

func (s *Server) logs(j *job, now time.Time) string {
	lines := []string{"Running entrypoint for job: " + j.req.Entrypoint}
	if !now.Before(j.submitted.Add(s.PendingFor + s.RunFor)) {
		if Fails(j.req.Entrypoint) {
			lines = append(lines, "RuntimeError: the entrypoint exited with code 1")
		} else {
			lines = append(lines, "done")
		}
	}
	return strings.Join(lines, "\n") + "\n"
}
