package framework

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/testenv"
)

// BuildLoom builds the loom binary, and loom-node-agent beside it, into
// dir, unless LOOM_BINARY names a loom binary (with loom-node-agent in the
// same directory).
func BuildLoom(dir string) (string, error) {
	if bin := os.Getenv("LOOM_BINARY"); bin != "" {
		return bin, nil
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	build := filepath.Join(dir, "build")
	if err := os.MkdirAll(build, 0o755); err != nil {
		return "", err
	}
	// Built as the image builds them (Dockerfile): the manager static, the
	// agent with cgo (NVML), neither with a symbol table or DWARF.
	for _, b := range []struct{ name, pkg, cgo string }{{"loom", "./cmd/manager", "0"}, {AgentBinaryName, "./cmd/node-agent", "1"}} {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(build, b.name), b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	// Run copies, as an image would be unpacked, not the linker's output
	// (see FreshCopy).
	if _, err := FreshCopy(filepath.Join(build, AgentBinaryName), dir); err != nil {
		return "", err
	}
	return FreshCopy(filepath.Join(build, "loom"), dir)
}

// AgentBinaryName is the node agent's binary, which sits beside loom's.
const AgentBinaryName = "loom-node-agent"

// AgentBinary is the loom-node-agent beside the loom binary loomBin.
func AgentBinary(loomBin string) string {
	return filepath.Join(filepath.Dir(loomBin), AgentBinaryName)
}

// Release is an installed Loom chart.
type Release struct {
	Name, Namespace string
	// ServiceAccount is the manager's service account the chart created.
	ServiceAccount string
}

// InstallChart installs charts/loom with helm (upgrade --install --wait) and
// extra --set values.
func (c *Cluster) InstallChart(ctx context.Context, name, namespace string, set ...string) (*Release, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	args := []string{"upgrade", "--install", name, filepath.Join(root, "charts", "loom"),
		"--namespace", namespace, "--create-namespace", "--kubeconfig", c.Kubeconfig,
		"--wait", "--timeout", "3m"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	if _, err := c.RunHelm(ctx, args...); err != nil {
		return nil, err
	}
	return &Release{Name: name, Namespace: namespace, ServiceAccount: name + "-manager"}, nil
}

// RunHelm runs the cluster's helm with its config and cache kept in the
// cluster directory.
func (c *Cluster) RunHelm(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.Helm(), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(c.Dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.Dir, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(c.Dir, "helm", "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Manager is a loom manager process running against the cluster.
type Manager struct {
	*Process
	ProbeURL   string
	MetricsURL string
	Kubeconfig string
	StartedAt  time.Time
}

// RunManager starts `loom manager` as a local process authenticated with a
// token of the release's own service account (TokenRequest), so that the
// chart's RBAC is what the manager runs with.
func (c *Cluster) RunManager(ctx context.Context, loomBin string, rel *Release, args ...string) (*Manager, error) {
	return c.RunManagerEnv(ctx, loomBin, rel, nil, args...)
}

// RunManagerEnv is RunManager with extra environment variables (GOGC=…).
func (c *Cluster) RunManagerEnv(ctx context.Context, loomBin string, rel *Release, env []string, args ...string) (*Manager, error) {
	tr, err := c.Clientset.CoreV1().ServiceAccounts(rel.Namespace).CreateToken(ctx, rel.ServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)}},
		metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", rel.Namespace, rel.ServiceAccount, err)
	}
	c.managers++
	name := "loom-manager"
	if c.managers > 1 {
		name = fmt.Sprintf("loom-manager-%d", c.managers)
	}
	kubeconfig := filepath.Join(c.Dir, name+".kubeconfig")
	if err := WriteKubeconfig(kubeconfig, c.Server, c.CAFile, tr.Status.Token, "system:serviceaccount:"+rel.Namespace+":"+rel.ServiceAccount); err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	probe := fmt.Sprintf("127.0.0.1:%d", ports[0])
	metrics := fmt.Sprintf("127.0.0.1:%d", ports[1])
	all := append([]string{"manager",
		"--health-probe-bind-address=" + probe,
		"--metrics-bind-address=" + metrics,
		"--leader-election-id=" + "loom-manager",
	}, args...)
	started := time.Now()
	p, err := c.StartProcess(name, loomBin,
		append([]string{"KUBECONFIG=" + kubeconfig, "POD_NAMESPACE=" + rel.Namespace}, env...), all...)
	if err != nil {
		return nil, err
	}
	return &Manager{Process: p, ProbeURL: "http://" + probe, MetricsURL: "https://" + metrics + "/metrics",
		Kubeconfig: kubeconfig, StartedAt: started}, nil
}

// WaitReady waits until the manager answers /readyz with 200 and holds the
// leader lease in its namespace.
func (c *Cluster) WaitReady(ctx context.Context, m *Manager, namespace, lease string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	return c.poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		if exited, err := m.Exited(); exited {
			return false, fmt.Errorf("manager exited (%v):\n%s", err, m.Tail(4000))
		}
		if !answersOK(ctx, hc, m.ProbeURL+"/readyz") {
			return false, nil
		}
		l := &coordinationv1.Lease{}
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: lease}, l); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return ptr.Deref(l.Spec.HolderIdentity, "") != "", nil
	}, "manager ready and leading")
}
