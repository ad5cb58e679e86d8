package framework

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/testenv"
)

// Anchor is an upstream operator that the benchmarks compare Loom with
// (hack/tools kuberay, training-operator), running as a local process beside
// the cluster with the admin kubeconfig. Both anchors are controller-runtime
// programs: their plain-HTTP /metrics carry client-go's
// rest_client_requests_total, counted the same way as Loom's.
type Anchor struct {
	*Process
	// Name and Version say which operator it is, for tables.
	Name, Version string
	MetricsURL    string
	// BuildTime is how long getting the binary took in this run: a moment
	// when hack/tools/build.sh found it cached.
	BuildTime time.Duration
}

// Metrics is the anchor's /metrics text.
func (a *Anchor) Metrics() (string, error) { return HTTPMetrics(a.MetricsURL) }

// StartKubeRay runs KubeRay's operator (all its controllers, as its chart
// does) after installing its CRDs: it exits at start when the RayJob or
// RayService CRD is missing. Leader election is off: a single replica needs
// none, and the comparison counts no one's lease renewals.
func (c *Cluster) StartKubeRay(ctx context.Context) (*Anchor, error) {
	dir, a, err := c.anchorTools(ctx, "kuberay", "KubeRay ray-operator")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	metrics, probe := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	bin, err := FreshCopy(filepath.Join(dir, "ray-operator"), c.Dir)
	if err != nil {
		return nil, err
	}
	a.Process, err = c.StartProcess("kuberay", bin, []string{"KUBECONFIG=" + c.Kubeconfig},
		"--metrics-addr="+metrics, "--health-probe-bind-address="+probe,
		"--enable-leader-election=false", "--log-stdout-encoder=console")
	if err != nil {
		return nil, err
	}
	a.MetricsURL = "http://" + metrics + "/metrics"
	return a, c.waitAnchorReady(ctx, a, "http://"+probe+"/readyz")
}

// InstallKubeRayCRDs installs KubeRay's CRDs as StartKubeRay does, without
// its operator: for a client that plays the operator itself.
func (c *Cluster) InstallKubeRayCRDs(ctx context.Context) error {
	_, _, err := c.anchorTools(ctx, "kuberay", "KubeRay ray-operator")
	return err
}

// trainingOperatorNamespace is where the Training Operator keeps its
// webhook certificate Secret (MY_POD_NAMESPACE; upstream's default).
const trainingOperatorNamespace = "kubeflow"

// StartTrainingOperator runs Kubeflow's Training Operator with only its
// PyTorchJob controller, after installing its CRDs. Its certificate rotator
// needs the (empty) Secret of its manifests and writes the serving
// certificate to the fixed /tmp/k8s-webhook-server/serving-certs: the
// operator runs in a private mount namespace where that directory is a bind
// mount of the run's own, so runs do not share it. Its validating webhook
// configuration is not installed (the API server could not reach the
// Service it names); the rotator then skips the CA injection, and the one
// PyTorchJob create of a benchmark is not validated.
func (c *Cluster) StartTrainingOperator(ctx context.Context) (*Anchor, error) {
	dir, a, err := c.anchorTools(ctx, "training-operator", "Training Operator")
	if err != nil {
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: trainingOperatorNamespace}}
	if err := client.IgnoreAlreadyExists(c.Client.Create(ctx, ns)); err != nil {
		return nil, err
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: trainingOperatorNamespace, Name: "training-operator-webhook-cert"}}
	if err := client.IgnoreAlreadyExists(c.Client.Create(ctx, secret)); err != nil {
		return nil, err
	}
	certs := filepath.Join(c.Dir, "training-operator-certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	bin, err := FreshCopy(filepath.Join(dir, "training-operator.v1"), c.Dir)
	if err != nil {
		return nil, err
	}
	metrics, probe := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	script := fmt.Sprintf(`set -e
mkdir -p /tmp/k8s-webhook-server
mount --bind %s /tmp/k8s-webhook-server
exec %s --metrics-bind-address=%s --health-probe-bind-address=%s --webhook-server-port=%d --enable-scheme=pytorchjob`,
		certs, bin, metrics, probe, ports[2])
	a.Process, err = c.StartProcess("training-operator", "unshare",
		[]string{"KUBECONFIG=" + c.Kubeconfig, "MY_POD_NAMESPACE=" + trainingOperatorNamespace},
		"--mount", "--propagation", "private", "sh", "-c", script)
	if err != nil {
		return nil, err
	}
	a.MetricsURL = "http://" + metrics + "/metrics"
	if err := c.mountSecret(ctx, secret, filepath.Join(certs, "serving-certs")); err != nil {
		a.Stop(10 * time.Second)
		return nil, fmt.Errorf("%w\n%s", err, a.Tail(4000))
	}
	return a, c.waitAnchorReady(ctx, a, "http://"+probe+"/readyz")
}

// mountSecret does what the kubelet does for a pod's Secret volume, once:
// it waits until the Secret holds a serving certificate (tls.crt) and
// writes each of its keys as a file into dir.
func (c *Cluster) mountSecret(ctx context.Context, secret *corev1.Secret, dir string) error {
	if err := c.poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		err := c.Client.Get(ctx, client.ObjectKeyFromObject(secret), secret)
		return err == nil && len(secret.Data["tls.crt"]) > 0, client.IgnoreNotFound(err)
	}, "the certificate in Secret "+secret.Name); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for k, v := range secret.Data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// anchorTools finds (or builds) the anchor's tool directory, installs the
// CRDs in its crds/ and reads its version from the directory's name
// (NAME-VERSION, as build.sh keys its cache).
func (c *Cluster) anchorTools(ctx context.Context, tool, name string) (string, *Anchor, error) {
	started := time.Now()
	dir, err := testenv.ToolDir(tool)
	if err != nil {
		return "", nil, err
	}
	a := &Anchor{Name: name, BuildTime: time.Since(started)}
	base := filepath.Base(dir)
	a.Version = base[strings.LastIndexByte(base, '-')+1:]
	crds, err := testenv.ReadManifests(filepath.Join(dir, "crds"))
	if err != nil {
		return "", nil, err
	}
	if len(crds) == 0 {
		return "", nil, fmt.Errorf("no CRDs in %s/crds", dir)
	}
	return dir, a, c.replaceCRDs(ctx, crds)
}

// waitAnchorReady waits until the anchor answers readyz with 200; on
// failure it stops the anchor and returns the tail of its log.
func (c *Cluster) waitAnchorReady(ctx context.Context, a *Anchor, readyz string) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	err := c.poll(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		if exited, err := a.Exited(); exited {
			return false, fmt.Errorf("%s exited: %v", a.Name, err)
		}
		// Ready, and serving metrics: controller-runtime starts its
		// metrics server apart from the probes, and a run that scraped
		// too early failed on a refused connection.
		return answersOK(ctx, hc, readyz) && answersOK(ctx, hc, a.MetricsURL), nil
	}, a.Name+" ready and serving metrics")
	if err != nil {
		a.Stop(10 * time.Second)
		return fmt.Errorf("%w\n%s", err, a.Tail(4000))
	}
	return nil
}

// answersOK says whether a GET of url answers 200 OK.
func answersOK(ctx context.Context, hc *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
