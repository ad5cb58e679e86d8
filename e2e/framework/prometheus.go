package framework

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/testenv"
)

// StartPrometheusOperator runs the real Prometheus Operator (hack/tools
// prometheus-operator, built once per version) against the cluster: it
// replaces any monitoring.coreos.com CRDs already installed with the
// operator's own, starts the operator with the admin kubeconfig and waits
// until it serves /healthz. Cluster.Stop stops it. The operator generates
// Prometheus configuration and rule files as on a real cluster; the Prometheus
// pods it asks for only ever run on kwok nodes or stay Pending.
func (c *Cluster) StartPrometheusOperator(ctx context.Context) (*Process, error) {
	dir, err := testenv.ToolDir("prometheus-operator")
	if err != nil {
		return nil, err
	}
	crds, err := testenv.ReadManifests(filepath.Join(dir, "crds"))
	if err != nil {
		return nil, err
	}
	if err := c.replaceCRDs(ctx, crds); err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	// The operator reads KUBECONFIG. Without --kubelet-service its kubelet
	// Endpoints controller (no kubelets here) stays off. Debug logs name the
	// objects each Prometheus selected and why others were rejected.
	p, err := c.StartProcess("prometheus-operator", filepath.Join(dir, "operator"),
		[]string{"KUBECONFIG=" + c.Kubeconfig},
		"--web.listen-address="+addr,
		"--log-level=debug")
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	err = c.poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}, "prometheus-operator /healthz")
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, p.Tail(4000))
	}
	return p, nil
}

// replaceCRDs creates each CRD or replaces the installed one whole (an update,
// not a merge: no field of an older schema survives, whoever wrote it), then
// waits until all are established.
func (c *Cluster) replaceCRDs(ctx context.Context, crds []*unstructured.Unstructured) error {
	names := make([]string, 0, len(crds))
	for _, crd := range crds {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(crd.GroupVersionKind())
		err := c.Client.Get(ctx, client.ObjectKeyFromObject(crd), cur)
		switch {
		case apierrors.IsNotFound(err):
			err = c.Client.Create(ctx, crd, client.FieldOwner(testenv.FieldOwner))
		case err == nil:
			crd.SetResourceVersion(cur.GetResourceVersion())
			err = c.Client.Update(ctx, crd, client.FieldOwner(testenv.FieldOwner))
		}
		if err != nil {
			return fmt.Errorf("installing CRD %s: %w", crd.GetName(), err)
		}
		names = append(names, crd.GetName())
	}
	return testenv.WaitForCRDs(ctx, c.Config, names...)
}

// PrometheusConfig returns the Prometheus configuration (YAML) that the
// operator generated for the Prometheus namespace/name: the gunzipped
// prometheus.yaml.gz of its Secret prometheus-<name>. The operator rewrites it
// asynchronously, so it polls until want (nil: any config) accepts it; on
// timeout it returns the last config seen with the error.
func (c *Cluster) PrometheusConfig(ctx context.Context, namespace, name string, timeout time.Duration, want func(cfg string) bool) (string, error) {
	var cfg string
	err := c.poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		s := &corev1.Secret{}
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "prometheus-" + name}, s); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		gz, ok := s.Data["prometheus.yaml.gz"]
		if !ok {
			return false, nil
		}
		zr, err := gzip.NewReader(bytes.NewReader(gz))
		if err != nil {
			return false, err
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			return false, err
		}
		cfg = string(b)
		return want == nil || want(cfg), nil
	}, fmt.Sprintf("generated config of Prometheus %s/%s", namespace, name))
	return cfg, err
}

// PrometheusRuleFiles returns the rule files (file name -> content) that the
// operator generated for the Prometheus namespace/name, from its ConfigMaps
// prometheus-<name>-rulefiles-N (labelled prometheus-name=<name>). File names
// are <namespace>-<rule name>-<uid>.yaml. Like PrometheusConfig it polls until
// want (nil: any rule file) accepts them.
func (c *Cluster) PrometheusRuleFiles(ctx context.Context, namespace, name string, timeout time.Duration, want func(files map[string]string) bool) (map[string]string, error) {
	var files map[string]string
	err := c.poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		cms := &corev1.ConfigMapList{}
		if err := c.Client.List(ctx, cms, client.InNamespace(namespace), client.MatchingLabels{"prometheus-name": name}); err != nil {
			return false, err
		}
		files = map[string]string{}
		for _, cm := range cms.Items {
			if !strings.HasPrefix(cm.Name, "prometheus-"+name+"-rulefiles-") {
				continue
			}
			for k, v := range cm.Data {
				files[k] = v
			}
		}
		if want == nil {
			return len(files) > 0, nil
		}
		return want(files), nil
	}, fmt.Sprintf("rule files of Prometheus %s/%s", namespace, name))
	return files, err
}
