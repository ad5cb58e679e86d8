package rayjob

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
)

// Dashboard is the part of a Ray cluster's dashboard Loom talks to: the Jobs
// REST API, by submission id.
type Dashboard interface {
	// Submit submits a Ray job and returns its submission id.
	Submit(ctx context.Context, req *utiltypes.RayJobRequest) (string, error)
	// Get returns the job's details; ErrJobNotFound when the cluster does
	// not know the id.
	Get(ctx context.Context, id string) (*utiltypes.RayJobInfo, error)
	// Stop asks the cluster to stop the job; a job already finished is not
	// an error.
	Stop(ctx context.Context, id string) error
	// Logs returns the job's driver logs.
	Logs(ctx context.Context, id string) (string, error)
}

// ErrJobNotFound: the dashboard does not know the submission id.
var ErrJobNotFound = errors.New("the Ray job does not exist on the cluster")

// DashboardTimeout bounds one dashboard request.
const DashboardTimeout = 5 * time.Second

// HTTPDashboard is Dashboard over HTTP.
type HTTPDashboard struct {
	base string
	hc   *http.Client
}

// NewHTTPDashboard talks to the dashboard at base (http://host:port), each
// request bounded by timeout.
func NewHTTPDashboard(base string, timeout time.Duration) *HTTPDashboard {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return &HTTPDashboard{base: strings.TrimRight(base, "/"), hc: &http.Client{Timeout: timeout}}
}

const jobsPath = "/api/jobs/"

// do sends one request and decodes a 200 answer into out; 404 is
// ErrJobNotFound, any other status an error carrying the answer's text.
func (d *HTTPDashboard) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return ErrJobNotFound
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

// Submit implements Dashboard.
func (d *HTTPDashboard) Submit(ctx context.Context, req *utiltypes.RayJobRequest) (string, error) {
	var resp struct {
		JobID        string `json:"job_id"`
		SubmissionID string `json:"submission_id"`
	}
	if err := d.do(ctx, http.MethodPost, jobsPath, req, &resp); err != nil {
		if errors.Is(err, ErrJobNotFound) {
			return "", fmt.Errorf("the dashboard at %s does not serve the Jobs API", d.base)
		}
		return "", err
	}
	if resp.SubmissionID != "" {
		return resp.SubmissionID, nil
	}
	return resp.JobID, nil
}

// Get implements Dashboard.
func (d *HTTPDashboard) Get(ctx context.Context, id string) (*utiltypes.RayJobInfo, error) {
	info := &utiltypes.RayJobInfo{}
	if err := d.do(ctx, http.MethodGet, jobsPath+url.PathEscape(id), nil, info); err != nil {
		return nil, err
	}
	return info, nil
}

// Stop implements Dashboard.
func (d *HTTPDashboard) Stop(ctx context.Context, id string) error {
	var resp utiltypes.RayJobStopResponse
	return d.do(ctx, http.MethodPost, jobsPath+url.PathEscape(id)+"/stop", nil, &resp)
}

// Logs implements Dashboard.
func (d *HTTPDashboard) Logs(ctx context.Context, id string) (string, error) {
	var resp utiltypes.RayJobLogsResponse
	if err := d.do(ctx, http.MethodGet, jobsPath+url.PathEscape(id)+"/logs", nil, &resp); err != nil {
		return "", err
	}
	return resp.Logs, nil
}

// dashboardBackoff is how long to wait before asking an unreachable
// dashboard again after attempts failed requests in a row: 1s, 2s, 4s, …
// up to a minute.
func dashboardBackoff(attempts int) time.Duration {
	if attempts < 1 {
		return time.Second
	}
	if attempts > 6 {
		return time.Minute
	}
	return time.Duration(1<<(attempts-1)) * time.Second
}
