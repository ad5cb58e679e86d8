package rayjob

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/common"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

func TestDesiredSubmitterIsKubeRays(t *testing.T) {
	j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
	j.Spec.RuntimeEnvYAML = "env_vars:\n  A: b\n"
	j.Spec.EntrypointNumCpus, j.Spec.EntrypointResources = 1, `{"r": 1}`
	rc := readyCluster()
	rc.Spec = *j.Spec.RayClusterSpec
	sj, err := desiredSubmitter(j, j.Status, rc)
	if err != nil {
		t.Fatal(err)
	}
	c := sj.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{
		"if ! ray job status --address http://" + j.Status.DashboardURL + " rj-abcde",
		"ray job submit --address http://" + j.Status.DashboardURL + " --no-wait",
		`--runtime-env-json '{"env_vars":{"A":"b"}}'`,
		"--submission-id rj-abcde", "--entrypoint-num-cpus 1.000000", `--entrypoint-resources '{"r": 1}'`,
		"-- python x.py ; fi ; ray job logs --address http://" + j.Status.DashboardURL + " --follow rj-abcde",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	if strings.Join(c.Command, " ") != "/bin/bash -ce --" && strings.Join(c.Command, " ") != "bash -ce --" && len(c.Command) == 0 {
		t.Errorf("command %v", c.Command)
	}
	if c.Image != "rayproject/ray:2.46.0" || sj.Name != "rj" || sj.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever ||
		ptr.Deref(sj.Spec.BackoffLimit, 0) != 2 || sj.Labels["ray.io/originated-from-crd"] != "RayJob" {
		t.Errorf("submitter %+v", sj)
	}
	// A template with its own command keeps it.
	j.Spec.SubmitterPodTemplate = &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "mine", Image: "me", Command: []string{"run"}}}}}
	j.Spec.SubmitterConfig = &rayv1.SubmitterConfig{BackoffLimit: ptr.To[int32](0)}
	sj, err = desiredSubmitter(j, j.Status, rc)
	if err != nil || sj.Spec.Template.Spec.Containers[0].Command[0] != "run" || len(sj.Spec.Template.Spec.Containers[0].Args) != 0 || *sj.Spec.BackoffLimit != 0 {
		t.Fatalf("custom template: %+v %v", sj, err)
	}
}

func TestDesiredClusterAndService(t *testing.T) {
	j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusInitializing)
	j.Labels = map[string]string{"team": "a"}
	j.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: "{}", "kueue": "x", AnnotationClusterUID: "uid-of-an-earlier-attempt",
		"ray.io/ft-enabled": "true"}
	rc := desiredCluster(j, "rj-fghij")
	if rc.Name != "rj-fghij" || rc.Labels["team"] != "a" || rc.Labels["ray.io/originated-from-cr-name"] != "rj" || rc.Annotations["kueue"] != "x" ||
		rc.Annotations["ray.io/ft-enabled"] != "true" || rc.Annotations[AnnotationClusterUID] != "" ||
		rc.Annotations[corev1.LastAppliedConfigAnnotation] != "" || rc.Spec.HeadGroupSpec.Template.Spec.Containers[0].Image != "rayproject/ray:2.46.0" {
		t.Fatalf("cluster %+v", rc)
	}
	rc.Spec.HeadGroupSpec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "dashboard", ContainerPort: 8265}}
	svc, err := desiredService(context.Background(), j, rc)
	if err != nil || svc.Name != "rj-head-svc" || svc.Spec.Selector["ray.io/cluster"] != "rj-fghij" {
		t.Fatalf("service %+v %v", svc, err)
	}
}

// A finished RayJob, not validated again, whose rayClusterSpec was edited
// away still gets its metadata for DeleteWorkers (which takes the running
// cluster's spec), instead of a nil dereference.
func TestDesiredClusterWithoutARayClusterSpec(t *testing.T) {
	j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusComplete)
	j.Spec.RayClusterSpec = nil
	if rc := desiredCluster(j, "rj-fghij"); rc.Name != "rj-fghij" || rc.Labels["ray.io/originated-from-cr-name"] != "rj" {
		t.Fatalf("cluster %+v", rc)
	}
}

// KubeRay's own RayJob samples pass validation (SidecarMode ones are
// refused with a message saying so).
func TestValidateKubeRaySamples(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ray-project/kuberay/ray-operator").Output()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "config", "samples", "ray-job.*.yaml"))
	if len(files) < 10 {
		t.Fatalf("only %d samples", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		j := &rayv1.RayJob{}
		for _, doc := range strings.Split(string(b), "\n---\n") {
			if strings.Contains(doc, "kind: RayJob") {
				if err := yaml.Unmarshal([]byte(doc), j); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
			}
		}
		if j.Name == "" {
			j.Name = j.GenerateName + "abcde" // as the API server names it
		}
		err = validate(normalized(j))
		if sidecar := j.Spec.SubmissionMode == rayv1.SidecarMode; (err != nil) != sidecar {
			t.Errorf("%s: %v", filepath.Base(f), err)
		}
	}
	for name, edit := range map[string]func(j *rayv1.RayJob){
		"suspend without shutdownAfterJobFinishes": func(j *rayv1.RayJob) { j.Spec.Suspend = true },
		"a negative submitter backoffLimit": func(j *rayv1.RayJob) {
			j.Spec.SubmitterConfig = &rayv1.SubmitterConfig{BackoffLimit: ptr.To[int32](-1)}
		},
		"retries on a selected cluster": func(j *rayv1.RayJob) {
			j.Spec.ClusterSelector, j.Spec.BackoffLimit = map[string]string{"ray.io/cluster": "theirs"}, ptr.To[int32](1)
		},
		"no entrypoint":           func(j *rayv1.RayJob) { j.Spec.Entrypoint = "" },
		"a blank entrypoint":      func(j *rayv1.RayJob) { j.Spec.Entrypoint = " \n\t" },
		"HTTPMode, no entrypoint": func(j *rayv1.RayJob) { j.Spec.SubmissionMode, j.Spec.Entrypoint = rayv1.HTTPMode, "" },
		"an entrypoint past what one argument of a process holds": func(j *rayv1.RayJob) {
			j.Spec.Entrypoint = "python -c '" + strings.Repeat("x", maxArgStrlen) + "'"
		},
		"a runtime env making the submit command past what one argument holds": func(j *rayv1.RayJob) {
			j.Spec.RuntimeEnvYAML = "env_vars:\n  BIG: " + strings.Repeat("x", maxArgStrlen-200)
		},
		"a submitter restarting Always": func(j *rayv1.RayJob) {
			j.Spec.SubmitterPodTemplate = &corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways,
				Containers: []corev1.Container{{Name: "submit", Image: "rayproject/ray:2.46.0"}}}}
		},
	} {
		j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusNew)
		edit(j)
		if err := validate(j); err == nil {
			t.Errorf("%s passed", name)
		}
	}
	j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusNew)
	j.Spec.ClusterSelector, j.Spec.BackoffLimit = map[string]string{"ray.io/cluster": "theirs"}, ptr.To[int32](0)
	if err := validate(j); err != nil {
		t.Errorf("a selected cluster with backoffLimit 0: %v", err)
	}
	// A long entrypoint that fits is no error, nor one Loom sends the
	// dashboard (HTTPMode) rather than a process's command line.
	j = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusNew)
	j.Spec.Entrypoint = "python -c '" + strings.Repeat("x", 100<<10) + "'"
	if err := validate(j); err != nil {
		t.Errorf("a 100 KiB entrypoint: %v", err)
	}
	j.Spec.SubmissionMode, j.Spec.Entrypoint = rayv1.HTTPMode, strings.Repeat("x", maxArgStrlen)
	if err := validate(j); err != nil {
		t.Errorf("a 128 KiB entrypoint in HTTPMode: %v", err)
	}
	// No entrypoint is needed where Loom submits none: the user does
	// (InteractiveMode), or the submitter template's own command does.
	j = baseJob(rayv1.InteractiveMode, rayv1.JobDeploymentStatusNew)
	j.Spec.Entrypoint = ""
	if err := validate(j); err != nil {
		t.Errorf("InteractiveMode without an entrypoint: %v", err)
	}
	j = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusNew)
	j.Spec.Entrypoint = ""
	j.Spec.SubmitterPodTemplate = &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "submit", Image: "rayproject/ray:2.46.0", Command: []string{"ray", "job", "submit", "--", "python", "x.py"}}}}}
	if err := validate(j); err != nil {
		t.Errorf("a submitter template with its own command, without an entrypoint: %v", err)
	}
	// Its pods restart Never, as a Job's must, when the template says
	// nothing (the API server would default Always and refuse the Job).
	j.Status.JobId, j.Status.DashboardURL = "rj-abcde", "rj-fghij-head-svc:8265"
	sj, err := desiredSubmitter(j, j.Status, readyCluster())
	if err != nil {
		t.Fatal(err)
	}
	if p := sj.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyNever {
		t.Errorf("the submitter of a template without restartPolicy restarts %q, want Never", p)
	}
}

// The submitter's bash gives Ray the runtime env, metadata and
// entrypoint resources as the RayJob has them (a $, a backtick, quotes,
// backslashes, a newline and non-ASCII text are not expanded or lost), and
// the job id as one word, whatever spec.jobId holds.
func TestTheSubmitCommandPassesTheRayJobsWordsAsWritten(t *testing.T) {
	j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
	j.Spec.RayClusterSpec.RayVersion = "2.46.0"
	j.Spec.RuntimeEnvYAML = "env_vars:\n  PASSWORD: 'pa$$word $HOME `id` it''s'\n  PATHS: \"C:\\\\tmp\\n\\\"é\\\"\"\n"
	j.Spec.Metadata = map[string]string{"owner": "$USER `whoami` 'me'"}
	j.Spec.EntrypointResources = `{"$r": 1}`
	j.Spec.JobId = "my job; $(id) 'x'"
	j.Status.JobId = j.Spec.JobId
	rc := readyCluster()
	rc.Spec = *j.Spec.RayClusterSpec
	sj, err := desiredSubmitter(j, j.Status, rc)
	if err != nil {
		t.Fatal(err)
	}
	kuberay, err := common.BuildJobSubmitCommand(j, rayv1.K8sJobMode)
	if err != nil {
		t.Fatal(err)
	}
	// ray prints the job id it is asked the status of, then, as the job is
	// not there, the words after the submit's and the logs' flags.
	// (the status's through fd 3: the command sends its output away).
	ray := `exec 3>&1; ray() { if [ "$2" = status ]; then printf 'status %s\0' "$5" >&3; return 1; fi; ` +
		`while [ $# -gt 0 ]; do case "$1" in --runtime-env-json|--metadata-json|--entrypoint-resources|--submission-id|--follow) printf '%s %s\0' "$1" "$2";; esac; shift; done; }; `
	out, err := exec.Command("bash", "-c", ray+sj.Spec.Template.Spec.Containers[0].Args[0]).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	want := []string{"status " + j.Spec.JobId}
	for i := 1; i < len(kuberay); i++ {
		switch kuberay[i-1] {
		case "--runtime-env-json", "--metadata-json", "--entrypoint-resources":
			s, err := strconv.Unquote(kuberay[i])
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, kuberay[i-1]+" "+s)
		case "--submission-id", "--follow":
			want = append(want, kuberay[i-1]+" "+j.Spec.JobId)
		}
	}
	if len(want) != 6 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("bash gave Ray\n%q\nwant\n%q", got, want)
	}
}

// The cluster carries every label of the RayJob, as KubeRay v1.5 copies
// them: Volcano's scheduler, queue and priority labels gang-schedule the
// created cluster as the RayJob asks, and Kueue's queue label comes along
// as in KubeRay (Kueue skips a cluster whose controller is its RayJob).
func TestDesiredClusterCarriesTheRayJobsLabels(t *testing.T) {
	j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusInitializing)
	j.Labels = map[string]string{
		"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": "research", "ray.io/priority-class-name": "high",
		"kueue.x-k8s.io/queue-name": "user-queue", "ray.io/originated-from-cr-name": "someone-else",
	}
	rc := desiredCluster(j, "rj-fghij")
	for k, v := range map[string]string{
		"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": "research", "ray.io/priority-class-name": "high",
		"kueue.x-k8s.io/queue-name": "user-queue", "ray.io/originated-from-cr-name": "rj", "ray.io/originated-from-crd": "RayJob",
	} {
		if rc.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, rc.Labels[k], v, rc.Labels)
		}
	}
	if len(j.Labels) != 5 || j.Labels["ray.io/originated-from-cr-name"] != "someone-else" {
		t.Fatalf("the RayJob's labels changed: %v", j.Labels)
	}
}
