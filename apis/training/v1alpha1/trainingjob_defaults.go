package v1alpha1

// Defaults the API server fills in are repeated here, so that objects built
// in Go (tests, older stored objects) behave the same.

// DefaultBackoffLimit is spec.runPolicy.backoffLimit's default.
const DefaultBackoffLimit int32 = 3

// DefaultMasterPort is spec.pytorch.masterPort's default.
const DefaultMasterPort int32 = 23456

// DefaultRetryableExitCodes is spec.failurePolicy.retryableExitCodes' default:
// deaths by a signal (SIGKILL, OOM kill, SIGTERM on preemption, ...).
var DefaultRetryableExitCodes = []ExitCodeRange{{Min: 128, Max: ptr(int32(255))}}

func ptr[T any](v T) *T { return &v }

// MaxSeconds is the largest value the API accepts in a seconds field
// (runPolicy.activeDeadlineSeconds, runPolicy.ttlSecondsAfterFinished): ten
// years, far below what overflows a time.Duration (about 292 years).
const MaxSeconds = 315360000

// Replicas returns a role's pod count (never negative: the API rejects a
// negative count, an object built in Go may carry one).
func (s *ReplicaSpec) replicas() int32 {
	if s == nil {
		return 0
	}
	if s.Replicas == nil {
		return 1
	}
	return max(*s.Replicas, 0)
}

// Workers returns the number of worker pods.
func (s *TrainingJobSpec) Workers() int32 { return s.ReplicaSpecs.Worker.replicas() }

// Pods returns the number of pods in the gang: the master and the workers.
func (s *TrainingJobSpec) Pods() int32 { return 1 + s.Workers() }

// BackoffLimit returns the number of gang restarts allowed.
func (s *TrainingJobSpec) BackoffLimit() int32 {
	if s.RunPolicy.BackoffLimit == nil {
		return DefaultBackoffLimit
	}
	return *s.RunPolicy.BackoffLimit
}

// CleanPodPolicy returns the clean-pod policy in effect.
func (s *TrainingJobSpec) CleanPodPolicy() CleanPodPolicy {
	if s.RunPolicy.CleanPodPolicy == "" {
		return CleanPodRunning
	}
	return s.RunPolicy.CleanPodPolicy
}

// MinAvailable returns how many pods must be placed together.
func (s *TrainingJobSpec) MinAvailable() int32 {
	if s.Gang.MinAvailable == nil || *s.Gang.MinAvailable > s.Pods() {
		return s.Pods()
	}
	return *s.Gang.MinAvailable
}

// Queue returns the Volcano queue.
func (s *TrainingJobSpec) Queue() string {
	if s.Gang.Queue == "" {
		return "default"
	}
	return s.Gang.Queue
}

// MasterPort returns the rendezvous port.
func (s *TrainingJobSpec) MasterPort() int32 {
	if s.PyTorch == nil || s.PyTorch.MasterPort == 0 {
		return DefaultMasterPort
	}
	return s.PyTorch.MasterPort
}

// Retryable reports whether a container exit code restarts the gang.
func (s *TrainingJobSpec) Retryable(exitCode int32) bool {
	ranges := s.FailurePolicy.RetryableExitCodes
	if len(ranges) == 0 {
		ranges = DefaultRetryableExitCodes
	}
	for _, r := range ranges {
		hi := r.Min
		if r.Max != nil {
			hi = *r.Max
		}
		if exitCode >= r.Min && exitCode <= hi {
			return true
		}
	}
	return false
}

// Finished reports whether the job has succeeded or failed.
func (st *TrainingJobStatus) Finished() bool {
	return st.State == StateSucceeded || st.State == StateFailed
}
