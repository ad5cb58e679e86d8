package v1alpha1

// Labels on every pod of a TrainingJob (Kubeflow's shape under Loom's
// domain); PodMonitors and dashboards select and group by them.
const (
	LabelJobName      = "training.loom.dev/job-name"
	LabelReplicaType  = "training.loom.dev/replica-type"
	LabelReplicaIndex = "training.loom.dev/replica-index"
	LabelJobRole      = "training.loom.dev/job-role"
	LabelAttempt      = "training.loom.dev/attempt"
)
