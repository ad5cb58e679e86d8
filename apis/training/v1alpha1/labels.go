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

// AnnotationWorkloadSuspended on a Kueue Workload says that Loom
// deactivated it (spec.active false) because its TrainingJob is suspended
// (runPolicy.suspend): Loom reactivates it when the job resumes. A
// Workload deactivated without it (by a person, or by Kueue) stays so until
// it is reactivated by hand.
const AnnotationWorkloadSuspended = "training.loom.dev/deactivated-while-suspended"
