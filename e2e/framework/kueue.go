package framework

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/testenv"
)

// Kueue is a running Kueue manager (hack/tools kueue) beside the cluster.
type Kueue struct {
	*Process
	// BuildTime is how long getting the binary took in this run: the build,
	// or a moment when hack/tools/build.sh found it cached.
	BuildTime time.Duration
	c         *Cluster
	webhooks  []*unstructured.Unstructured
}

// KueueOptions configure StartKueue.
type KueueOptions struct {
	// Frameworks are Kueue's built-in integrations to enable
	// (integrations.frameworks, e.g. ray.io/raycluster).
	Frameworks []string
	// ExternalFrameworks are the kinds other controllers integrate
	// (Kind.version.group).
	ExternalFrameworks []string
}

// StartKueue runs the real Kueue as a local process with its webhooks on
// loopback: a self-signed certificate for 127.0.0.1 serves them; Kueue's
// CRDs (conversion webhooks included) and its admission webhook
// configurations for its own and Ray's kinds (the built-in Pod, Job,
// Deployment … webhooks would hold every pod of the shared cluster on this
// one process) are installed with clientConfig.url and that caBundle;
// internal cert management and the VisibilityOnDemand feature are off. Kueue
// reads its metrics certificate from the fixed /etc/kueue/metrics/certs, so
// it runs in a private mount namespace over an overlay of /etc that holds
// it: the host's /etc is untouched. Stop stops it and removes its webhook
// configurations.
func (c *Cluster) StartKueue(ctx context.Context, o KueueOptions) (*Kueue, error) {
	started := time.Now()
	dir, err := testenv.ToolDir("kueue")
	if err != nil {
		return nil, err
	}
	k := &Kueue{c: c, BuildTime: time.Since(started)}
	work := filepath.Join(c.Dir, "kueue")
	certDir := filepath.Join(work, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	caPEM, err := writeLoopbackCert(certDir)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	base := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	if err := c.installKueueManifests(ctx, dir, base, caPEM, k); err != nil {
		return nil, err
	}
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kueue-system"}}); client.IgnoreAlreadyExists(err) != nil {
		return nil, err
	}
	cfg := filepath.Join(work, "config.yaml")
	health := fmt.Sprintf("127.0.0.1:%d", ports[1])
	if err := os.WriteFile(cfg, []byte(kueueConfig(o, ports[0], certDir, health, fmt.Sprintf("127.0.0.1:%d", ports[2]))), 0o600); err != nil {
		return nil, err
	}
	// The overlay's upper and work directories live in the run's directory;
	// the mount exists only in Kueue's mount namespace.
	script := fmt.Sprintf(`set -e
up=%[1]s/etc-upper; wk=%[1]s/etc-work; mkdir -p "$up" "$wk"
mount -t overlay overlay -o lowerdir=/etc,upperdir="$up",workdir="$wk" /etc
mkdir -p /etc/kueue/metrics/certs && cp %[2]s/tls.crt %[2]s/tls.key /etc/kueue/metrics/certs/
exec %[3]s --config=%[4]s --zap-log-level=3`, work, certDir, filepath.Join(dir, "kueue"), cfg)
	p, err := c.StartProcess("kueue", "unshare", []string{"KUBECONFIG=" + c.Kubeconfig},
		"--mount", "--propagation", "private", "sh", "-c", script)
	if err != nil {
		return nil, err
	}
	k.Process = p
	if err := c.waitKueueReady(ctx, health, base); err != nil {
		k.Stop()
		return nil, fmt.Errorf("%w\n%s", err, p.Tail(6000))
	}
	return k, nil
}

// Stop stops Kueue and removes its webhook configurations, so that the
// cluster's other tests do not call a webhook nobody serves.
func (k *Kueue) Stop() {
	k.Process.Stop(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, w := range k.webhooks {
		_ = client.IgnoreNotFound(k.c.Client.Delete(ctx, w))
	}
}

func (c *Cluster) waitKueueReady(ctx context.Context, health, webhook string) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a readiness probe of our own loopback server
	return c.poll(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		if exited, err := c.lastExited("kueue"); exited {
			return false, fmt.Errorf("kueue exited: %v", err)
		}
		for _, u := range []string{"http://" + health + "/readyz", webhook + "/healthz-unused"} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			resp, err := hc.Do(req)
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			if strings.HasPrefix(u, "http://") && resp.StatusCode != http.StatusOK {
				return false, nil
			}
		}
		return true, nil
	}, "kueue /readyz and its webhook server")
}

func (c *Cluster) lastExited(name string) (bool, error) {
	for i := len(c.procs) - 1; i >= 0; i-- {
		if c.procs[i].Name == name {
			return c.procs[i].Exited()
		}
	}
	return false, nil
}

func kueueConfig(o KueueOptions, webhookPort int, certDir, health, metrics string) string {
	list := func(xs []string) string {
		if len(xs) == 0 {
			return "[]"
		}
		return "[" + strings.Join(xs, ", ") + "]"
	}
	return fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: %s
metrics:
  bindAddress: %s
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
featureGates:
  VisibilityOnDemand: false
integrations:
  frameworks: %s
  externalFrameworks: %s
`, health, metrics, webhookPort, certDir, list(o.Frameworks), list(o.ExternalFrameworks))
}

// installKueueManifests installs Kueue's CRDs, with conversion webhooks
// where Kueue's kustomization patches them in, and the admission webhook
// configurations for kueue.x-k8s.io and ray.io, all pointing at base.
func (c *Cluster) installKueueManifests(ctx context.Context, dir, base string, caPEM []byte, k *Kueue) error {
	crds, err := testenv.ReadManifests(filepath.Join(dir, "config", "crd"))
	if err != nil {
		return err
	}
	for _, crd := range crds {
		plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
		if _, err := os.Stat(filepath.Join(dir, "config", "crd-patches", "webhook_in_"+plural+".yaml")); err != nil {
			continue
		}
		conv := map[string]any{"strategy": "Webhook", "webhook": map[string]any{
			"clientConfig":             map[string]any{"url": base + "/convert", "caBundle": caBundle(caPEM)},
			"conversionReviewVersions": []any{"v1"},
		}}
		if err := unstructured.SetNestedMap(crd.Object, conv, "spec", "conversion"); err != nil {
			return err
		}
	}
	if err := c.replaceCRDs(ctx, crds); err != nil {
		return err
	}
	hooks, err := testenv.ReadManifests(filepath.Join(dir, "config", "webhook", "manifests.yaml"))
	if err != nil {
		return err
	}
	for _, h := range hooks {
		if err := loopbackWebhooks(h, base, caPEM); err != nil {
			return err
		}
		h.SetName("kueue-" + h.GetName())
		_ = client.IgnoreNotFound(c.Client.Delete(ctx, h.DeepCopy()))
		if err := c.Client.Create(ctx, h, client.FieldOwner(testenv.FieldOwner)); err != nil {
			return fmt.Errorf("creating %s %s: %w", h.GetKind(), h.GetName(), err)
		}
		k.webhooks = append(k.webhooks, h)
	}
	return nil
}

// loopbackWebhooks keeps the webhooks of cfg that serve kueue.x-k8s.io or
// ray.io and points each at base plus its service path.
func loopbackWebhooks(cfg *unstructured.Unstructured, base string, caPEM []byte) error {
	ws, _, _ := unstructured.NestedSlice(cfg.Object, "webhooks")
	var keep []any
	for _, w := range ws {
		m, _ := w.(map[string]any)
		if !servesGroups(m, "kueue.x-k8s.io", "ray.io") {
			continue
		}
		path, _, _ := unstructured.NestedString(m, "clientConfig", "service", "path")
		m["clientConfig"] = map[string]any{"url": base + path, "caBundle": caBundle(caPEM)}
		keep = append(keep, m)
	}
	return unstructured.SetNestedSlice(cfg.Object, keep, "webhooks")
}

func servesGroups(w map[string]any, groups ...string) bool {
	rules, _, _ := unstructured.NestedSlice(w, "rules")
	for _, r := range rules {
		gs, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "apiGroups")
		for _, g := range gs {
			if slices.Contains(groups, g) {
				return true
			}
		}
	}
	return false
}

func caBundle(caPEM []byte) string {
	return base64.StdEncoding.EncodeToString(caPEM)
}

// writeLoopbackCert writes a self-signed serving certificate for 127.0.0.1
// as dir/tls.crt and dir/tls.key and returns the certificate (its own CA).
func writeLoopbackCert(dir string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "kueue-loopback"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return nil, err
	}
	return certPEM, nil
}
