package charts

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/internal/testenv"
)

// helm upgrade --reuse-values on an API server, from a release of a chart
// whose values lack the newer ones (the security contexts, the agent's log
// format): the Deployment helm writes has the hardened security contexts
// and the DaemonSet a --log-format, as a fresh install's.
func TestHelmUpgradeReuseValuesOnAPIServer(t *testing.T) {
	ctx := context.Background()
	env, err := testenv.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	kc := writeKubeconfig(t, env.Config)
	var defaults map[string]any
	raw, err := os.ReadFile(filepath.Join(chartDir(), "values.yaml"))
	if err == nil {
		err = yaml.Unmarshal(raw, &defaults)
	}
	if err != nil {
		t.Fatal(err)
	}
	// The older chart: without those values, and without the defaults the
	// templates now fall back to.
	older := chartWithValues(t, withoutKeys(defaults, "manager.podSecurityContext", "manager.securityContext", "nodeAgent.logFormat"))
	helpers := filepath.Join(older, "templates", "_helpers.tpl")
	b, err := os.ReadFile(helpers)
	if err == nil {
		err = os.WriteFile(helpers, []byte(strings.Replace(string(b), `.Files.Get "files/values.yaml"`, `.Files.Get "none"`, 1)), 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"--namespace", "gpu-platform", "--kubeconfig", kc, "--skip-crds"}
	if out, err := helm(t, append([]string{"install", "loom", older, "--create-namespace", "--set", "uninstall.cleanup=true"}, base...)...); err != nil {
		t.Fatalf("helm install of the older chart: %v\n%s", err, out)
	}
	dep := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "gpu-platform", Name: "loom-manager"}, dep); err != nil {
		t.Fatal(err)
	}
	if dep.Spec.Template.Spec.SecurityContext.RunAsNonRoot != nil {
		t.Fatalf("the older chart's Deployment already has a pod security context: %+v", dep.Spec.Template.Spec.SecurityContext)
	}
	if out, err := helm(t, append([]string{"upgrade", "loom", chartDir(), "--reuse-values"}, base...)...); err != nil {
		t.Fatalf("helm upgrade --reuse-values: %v\n%s", err, out)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "gpu-platform", Name: "loom-manager"}, dep); err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template.Spec
	if psc := pod.SecurityContext; psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil {
		t.Errorf("after helm upgrade --reuse-values, the manager's pod securityContext %+v", psc)
	}
	if sc := pod.Containers[0].SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("after helm upgrade --reuse-values, the manager's securityContext %+v", sc)
	}
	ds := &appsv1.DaemonSet{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "gpu-platform", Name: "loom-node-agent"}, ds); err != nil {
		t.Fatal(err)
	}
	if args := ds.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--log-format=json") {
		t.Errorf("after helm upgrade --reuse-values, the node agent's args %q", args)
	}
	// The release's own value stays: the uninstall hook is still on.
	if out, err := helm(t, append([]string{"get", "values", "loom"}, base[:4]...)...); err != nil || !strings.Contains(out, "cleanup: true") {
		t.Errorf("helm get values after the upgrade: %v\n%s", err, out)
	}
}

// writeKubeconfig writes a kubeconfig for the API server of cfg.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
