package rayfake

import (
	"encoding/json"
	"net/http"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
)

// Handler serves the Jobs REST API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/jobs/", s.submit)
	mux.HandleFunc("GET /api/jobs/{id}", s.get)
	mux.HandleFunc("POST /api/jobs/{id}/stop", s.stop)
	mux.HandleFunc("GET /api/jobs/{id}/logs", s.getLogs)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests++
		down := s.down
		s.mu.Unlock()
		if down {
			http.Error(w, "dashboard is down", http.StatusServiceUnavailable)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) submit(w http.ResponseWriter, r *http.Request) {
	var req utiltypes.RayJobRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id, err := s.Submit(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	writeJSON(w, map[string]string{"job_id": id, "submission_id": id})
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	j, ok := s.jobs[id]
	var info utiltypes.RayJobInfo
	if ok {
		info = s.info(id, j, s.now())
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "Job "+id+" does not exist", http.StatusNotFound)
		return
	}
	writeJSON(w, info)
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	j, ok := s.jobs[id]
	stopped := false
	if ok {
		now := s.now()
		if !rayv1.IsJobTerminal(s.info(id, j, now).JobStatus) {
			j.stoppedAt, stopped = now, true
		}
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "Job "+id+" does not exist", http.StatusNotFound)
		return
	}
	writeJSON(w, utiltypes.RayJobStopResponse{Stopped: stopped})
}

func (s *Server) getLogs(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	j, ok := s.jobs[id]
	var logs string
	if ok {
		logs = s.logs(j, s.now())
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "Job "+id+" does not exist", http.StatusNotFound)
		return
	}
	writeJSON(w, utiltypes.RayJobLogsResponse{Logs: logs})
}
