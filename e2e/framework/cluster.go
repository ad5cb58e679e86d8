// Package framework runs a simulated Kubernetes cluster for Loom's end-to-end
// tests and its demo: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok, all built from source (hack/tools), on ports and
// directories picked per run. Nodes are kwok's simulated nodes, with GPUs as
// extended resources.
package framework

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	_ "embed"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// Options configure a cluster.
type Options struct {
	// Dir holds the cluster's data, certificates, kubeconfigs and logs. Empty:
	// a new temporary directory, removed by Stop unless KeepDir.
	Dir     string
	KeepDir bool
	// Logf receives progress lines (nil: silent).
	Logf func(format string, args ...any)
	// Audit has kube-apiserver log every write, get and list (not watches)
	// to Cluster.AuditLog, for Cluster.Audit: who sent what, by resource.
	Audit bool
	// Profiling serves kube-apiserver's /debug/pprof, for Cluster.CPUProfile.
	Profiling bool
}

// Cluster is a running simulated cluster.
type Cluster struct {
	Dir string
	// Kubeconfig is the path of an admin kubeconfig.
	Kubeconfig string
	Config     *rest.Config
	Client     client.Client
	Clientset  *kubernetes.Clientset
	// Server is the API server's URL; CAFile its serving certificate.
	Server string
	CAFile string
	// AuditLog is the API server's JSON-lines audit log (Options.Audit;
	// empty without).
	AuditLog string

	opts    Options
	tools   tools
	procs   []*Process
	ownsDir bool
	// managers counts RunManager calls: each manager logs to its own file.
	managers int
}

type tools struct{ kube, kwok, helm string }

// SimStages are Loom's kwok stages that end pods carrying the sim.loom.dev
// annotations with a chosen exit code after a chosen time (see the file).
//
//go:embed sim-stages.yaml
var SimStages []byte

// Start brings the control plane up and waits until it serves. On error
// everything started so far is stopped.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	c := &Cluster{opts: opts, Dir: opts.Dir}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "loom-e2e-"); err != nil {
			return nil, err
		}
		c.ownsDir = !opts.KeepDir
	} else if err = os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	for name, dst := range map[string]*string{"kube": &c.tools.kube, "kwok": &c.tools.kwok, "helm": &c.tools.helm} {
		if *dst, err = testenv.ToolDir(name); err != nil {
			return nil, err
		}
	}

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	c.Server = fmt.Sprintf("https://127.0.0.1:%d", ports[2])

	pki := filepath.Join(c.Dir, "pki")
	if err = os.MkdirAll(pki, 0o700); err != nil {
		return nil, err
	}
	if err = writeServiceAccountKeys(pki); err != nil {
		return nil, err
	}
	token, err := randomToken()
	if err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(pki, "tokens.csv")
	if err = os.WriteFile(tokenFile, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return nil, err
	}

	opts.Logf("starting etcd on %s", etcdURL)
	if err = c.start("etcd", filepath.Join(c.tools.kube, "etcd"),
		"--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		"--unsafe-no-fsync", "--quota-backend-bytes", strconv.Itoa(4<<30)); err != nil {
		return nil, err
	}

	opts.Logf("starting kube-apiserver on %s", c.Server)
	var audit []string
	if opts.Audit {
		if audit, err = c.auditFlags(); err != nil {
			return nil, err
		}
	}
	if err = c.start("kube-apiserver", filepath.Join(c.tools.kube, "kube-apiserver"), append(audit,
		"--etcd-servers", etcdURL,
		"--allow-privileged=true",
		"--secure-port", strconv.Itoa(ports[2]), "--bind-address", "127.0.0.1",
		// Loopback cannot be advertised through the kubernetes Service endpoints;
		// nothing in a simulated pod dials the API server anyway.
		"--endpoint-reconciler-type", "none",
		"--cert-dir", pki,
		"--token-auth-file", tokenFile,
		"--authorization-mode", "Node,RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--enable-priority-and-fairness=true",
		"--profiling="+strconv.FormatBool(opts.Profiling))...); err != nil {
		return nil, err
	}
	c.CAFile = filepath.Join(pki, "apiserver.crt")
	if err = c.waitForFile(ctx, c.CAFile, 60*time.Second); err != nil {
		return nil, err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err = WriteKubeconfig(c.Kubeconfig, c.Server, c.CAFile, token, "admin"); err != nil {
		return nil, err
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return nil, err
	}
	c.Config.QPS, c.Config.Burst = 200, 400
	if err = c.waitHealthy(ctx, "/readyz", 90*time.Second); err != nil {
		return nil, err
	}
	if c.Client, err = client.New(c.Config, client.Options{Scheme: manager.Scheme()}); err != nil {
		return nil, err
	}
	if c.Clientset, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}

	opts.Logf("starting kube-controller-manager, kube-scheduler and kwok")
	if err = c.start("kube-controller-manager", filepath.Join(c.tools.kube, "kube-controller-manager"),
		"--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--leader-elect=false",
		"--service-account-private-key-file", filepath.Join(pki, "sa.key"),
		"--root-ca-file", c.CAFile,
		"--use-service-account-credentials",
		"--controllers", "*",
		"--secure-port", "0",
		"--kube-api-qps", "200", "--kube-api-burst", "400",
		"--concurrent-deployment-syncs", "10", "--concurrent-replicaset-syncs", "10",
		"--concurrent-daemonset-syncs", "10", "--concurrent-gc-syncs", "20",
		// kwok renews every node's lease (a quarter of its duration, below).
		// At 1,000 nodes on two cores the node-lifecycle controller's view of
		// the leases fell behind, and it marked healthy nodes' pods
		// Ready=False, which kwok never undoes: DaemonSets stayed short of
		// ready for good. A grace period well past the lease duration keeps
		// that from happening on a busy machine.
		"--node-monitor-grace-period", "5m"); err != nil {
		return nil, err
	}
	if err = c.start("kube-scheduler", filepath.Join(c.tools.kube, "kube-scheduler"),
		"--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--leader-elect=false",
		"--secure-port", "0",
		"--kube-api-qps", "200", "--kube-api-burst", "400"); err != nil {
		return nil, err
	}
	simStages := filepath.Join(c.Dir, "loom-sim-stages.yaml")
	if err = os.WriteFile(simStages, SimStages, 0o644); err != nil {
		return nil, err
	}
	if err = c.start("kwok", filepath.Join(c.tools.kwok, "kwok"),
		"--kubeconfig", c.Kubeconfig,
		"--config", filepath.Join(c.tools.kwok, "stages.yaml"),
		"--config", simStages,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector", KwokAnnotation+"=fake",
		"--cidr", "10.0.0.1/16", "--node-ip", "10.0.0.1",
		// Without leases the node-lifecycle controller marks every pod
		// NotReady. Renewed every 30 s: 33 writes/s at 1,000 nodes, not 100.
		"--node-lease-duration-seconds", "120"); err != nil {
		return nil, err
	}
	// The runtime class the NVIDIA container toolkit installs; GPU pods (the
	// node agent among them) name it.
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia"}, Handler: "nvidia"}
	if err = c.Client.Create(ctx, rc); err != nil {
		return nil, fmt.Errorf("creating RuntimeClass nvidia: %w", err)
	}
	if err = c.waitForServiceAccount(ctx, "default", "default", 60*time.Second); err != nil {
		return nil, fmt.Errorf("kube-controller-manager is not creating service accounts: %w", err)
	}
	opts.Logf("control plane ready (dir %s)", c.Dir)
	return c, nil
}

// Stop stops every process the cluster started (newest first) and removes
// the cluster's directory if it made it.
func (c *Cluster) Stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].Stop(10 * time.Second)
	}
	c.procs = nil
	if c.ownsDir && c.Dir != "" {
		_ = os.RemoveAll(c.Dir)
	}
}

// Processes lists the processes the cluster started (for their PIDs and logs).
func (c *Cluster) Processes() []*Process { return append([]*Process(nil), c.procs...) }

// Helm is the path of the helm binary the cluster uses.
func (c *Cluster) Helm() string { return filepath.Join(c.tools.helm, "helm") }

// Kubectl is the path of the kubectl binary built with the control plane.
func (c *Cluster) Kubectl() string { return filepath.Join(c.tools.kube, "kubectl") }

// Check returns an error naming any process the cluster started that has
// exited without being stopped, with the end of its log.
func (c *Cluster) Check() error {
	var errs []error
	for _, p := range c.procs {
		if p.stopped.Load() {
			continue
		}
		if exited, err := p.Exited(); exited {
			errs = append(errs, fmt.Errorf("%s exited (%v):\n%s", p.Name, err, p.Tail(2000)))
		}
	}
	return errors.Join(errs...)
}

// CrashAPIServer kills kube-apiserver with SIGKILL, starts it again with the
// same flags (same port, same etcd) after down, and waits until it serves.
func (c *Cluster) CrashAPIServer(ctx context.Context, down time.Duration) error {
	for i, p := range c.procs {
		if p.Name != "kube-apiserver" {
			continue
		}
		p.Kill()
		time.Sleep(down)
		np, err := startProcess(c.Dir, fmt.Sprintf("kube-apiserver-%d", i), p.bin, nil, p.args...)
		if err != nil {
			return err
		}
		c.procs[i] = np
		if err := c.waitHealthy(ctx, "/readyz", 90*time.Second); err != nil {
			return err
		}
		// kube-scheduler's cache does not survive its API server's crash
		// (it exits a while later with "Scheduler cache is corrupted"); on a
		// real control plane its static pod restarts. Restart it here.
		return c.restart("kube-scheduler")
	}
	return errors.New("no kube-apiserver process")
}

// restart kills the named process and starts it again with the same flags.
func (c *Cluster) restart(name string) error {
	for i, p := range c.procs {
		if p.Name != name && !strings.HasPrefix(p.Name, name+"-") {
			continue
		}
		p.Kill()
		np, err := startProcess(c.Dir, fmt.Sprintf("%s-%d", name, time.Now().UnixNano()%1000000), p.bin, nil, p.args...)
		if err != nil {
			return err
		}
		c.procs[i] = np
		return nil
	}
	return fmt.Errorf("no %s process", name)
}

func (c *Cluster) start(name, bin string, args ...string) error {
	p, err := startProcess(c.Dir, name, bin, nil, args...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

// StartProcess starts another process that Stop will stop with the cluster
// (the manager under test, say), logging to Dir/name.log.
func (c *Cluster) StartProcess(name, bin string, env []string, args ...string) (*Process, error) {
	p, err := startProcess(c.Dir, name, bin, env, args...)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	return p, nil
}

func (c *Cluster) waitForFile(ctx context.Context, path string, timeout time.Duration) error {
	return c.poll(ctx, timeout, func(context.Context) (bool, error) {
		st, err := os.Stat(path)
		return err == nil && st.Size() > 0, nil
	}, "waiting for "+path)
}

func (c *Cluster) waitHealthy(ctx context.Context, path string, timeout time.Duration) error {
	rc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return err
	}
	var last string
	err = c.poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.Server+path, nil)
		resp, err := rc.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK, nil
	}, "API server "+path)
	if err != nil {
		return fmt.Errorf("%w (last: %s)", err, last)
	}
	return nil
}

func (c *Cluster) waitForServiceAccount(ctx context.Context, ns, name string, timeout time.Duration) error {
	return c.poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		_, err := c.Clientset.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil, nil
	}, "service account "+ns+"/"+name)
}

// poll runs cond until it is true, failing early when a control-plane
// process has died.
func (c *Cluster) poll(ctx context.Context, timeout time.Duration, cond wait.ConditionWithContextFunc, what string) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Check(); err != nil {
			return false, err
		}
		return cond(ctx)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// WriteKubeconfig writes a kubeconfig for server authenticating with token.
func WriteKubeconfig(path, server, caFile, token, user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["loom-e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["loom-e2e"] = &clientcmdapi.Context{Cluster: "loom-e2e", AuthInfo: user}
	cfg.CurrentContext = "loom-e2e"
	return clientcmd.WriteToFile(*cfg, path)
}

func writeServiceAccountKeys(dir string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"),
		pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// CPUProfile is kube-apiserver's CPU profile over the next d (pprof's
// format; the cluster must run with Options.Profiling).
func (c *Cluster) CPUProfile(ctx context.Context, d time.Duration) ([]byte, error) {
	secs := max(int(d.Seconds()), 1)
	return c.Clientset.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(secs)).Timeout(d + time.Minute).DoRaw(ctx)
}
