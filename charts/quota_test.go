package charts

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/loom-dev/loom/internal/testenv"
)

// gkeAdmission limits pods of the critical PriorityClasses to namespaces
// with a ResourceQuota of that scope, as GKE's API server does.
const gkeAdmission = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ResourceQuota
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ResourceQuotaConfiguration
      limitedResources:
        - resource: pods
          matchScopes:
            - scopeName: PriorityClass
              operator: In
              values: ["system-node-critical", "system-cluster-critical"]
`

// On an API server that admits system-node-critical pods only in a
// namespace with a ResourceQuota of that scope (GKE), the chart's quota
// lets the node agent and the operands, which run at that priority in the
// release namespace, be created; criticalPodsQuota=false renders none.
func TestCriticalPodsQuota(t *testing.T) {
	dir := t.TempDir()
	admission := filepath.Join(dir, "admission.yaml")
	if err := os.WriteFile(admission, []byte(gkeAdmission), 0o600); err != nil {
		t.Fatal(err)
	}
	assets, err := testenv.ToolDir("kube")
	if err != nil {
		t.Fatal(err)
	}
	te := &envtest.Environment{BinaryAssetsDirectory: assets}
	te.ControlPlane.GetAPIServer().Configure().Set("admission-control-config-file", admission)
	cfg, err := te.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = te.Stop() }()
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{"gpu-platform", "bare"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := testenv.RenderChart("gpu-platform")
	if err != nil {
		t.Fatal(err)
	}
	var quotas int
	for _, o := range objs {
		if o.GetKind() == "ResourceQuota" {
			quotas++
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	if quotas != 1 {
		t.Fatalf("the chart rendered %d ResourceQuotas, want 1", quotas)
	}
	critical := func(ns string) error {
		return c.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent"},
			Spec: corev1.PodSpec{PriorityClassName: "system-node-critical", Containers: []corev1.Container{{Name: "c", Image: "loom"}}}}, client.DryRunAll)
	}
	if err := critical("bare"); err == nil || !strings.Contains(err.Error(), "insufficient quota to match these scopes") {
		t.Fatalf("the API server does not limit critical pods as GKE's does: %v", err)
	}
	if err := critical("gpu-platform"); err != nil {
		t.Errorf("a system-node-critical pod in the release namespace: %v", err)
	}
	objs, err = testenv.RenderChart("gpu-platform", "criticalPodsQuota=false")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "ResourceQuota" {
			t.Errorf("criticalPodsQuota=false renders ResourceQuota %s", o.GetName())
		}
	}
}
