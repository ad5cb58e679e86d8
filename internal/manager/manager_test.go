package manager_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// leaderCounter is a controller stand-in: a runnable that needs leader
// election and counts how often it was started.
func leaderCounter(started *atomic.Int32) manager.SetupFunc {
	return func(_ context.Context, mgr ctrl.Manager, _ manager.Options) error {
		return mgr.Add(leaderRunnable{started})
	}
}

type leaderRunnable struct{ started *atomic.Int32 }

func (r leaderRunnable) Start(ctx context.Context) error {
	r.started.Add(1)
	<-ctx.Done()
	return nil
}
func (leaderRunnable) NeedLeaderElection() bool { return true }

func TestManagerLeadsServesProbesAndSecuredMetrics(t *testing.T) {
	var started, notSelected atomic.Int32
	reg := &manager.Registry{}
	reg.Add("counter", leaderCounter(&started))
	reg.Add("other", leaderCounter(&notSelected))
	opts := testenv.ManagerOptions(t)
	opts.Controllers = "counter"
	m := env.StartManager(t, opts, reg)

	waitElected(t, m, 30*time.Second)
	t.Logf("manager elected %s after start", time.Since(m.StartedAt).Round(time.Millisecond))
	testenv.Eventually(t, 30*time.Second, func() error { return expectStatus(m.ProbeURL+"/readyz", "", http.StatusOK) })
	t.Logf("manager ready %s after start", time.Since(m.StartedAt).Round(time.Millisecond))
	if err := expectStatus(m.ProbeURL+"/healthz", "", http.StatusOK); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if started.Load() != 1 {
			return fmt.Errorf("selected controller started %d times", started.Load())
		}
		return nil
	})
	if notSelected.Load() != 0 {
		t.Fatal("a controller not in --controllers was started")
	}

	ctx := context.Background()
	lease := &coordinationv1.Lease{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: opts.Namespace, Name: opts.LeaderElectionID}, lease); err != nil {
		t.Fatalf("leader lease: %v", err)
	}
	if ptr.Deref(lease.Spec.HolderIdentity, "") == "" {
		t.Fatal("lease has no holder")
	}

	// /metrics: anonymous is unauthenticated, a token without the
	// non-resource rule is forbidden, the metrics reader gets the series.
	testenv.Eventually(t, 10*time.Second, func() error { return expectStatus(m.MetricsURL, "", http.StatusUnauthorized) })
	noRights := serviceAccountToken(t, opts.Namespace, "no-rights", false)
	if err := expectStatus(m.MetricsURL, noRights, http.StatusForbidden); err != nil {
		t.Fatal(err)
	}
	reader := serviceAccountToken(t, opts.Namespace, "metrics-reader", true)
	testenv.Eventually(t, 10*time.Second, func() error {
		body, err := get(m.MetricsURL, reader, http.StatusOK)
		if err != nil {
			return err
		}
		for _, want := range []string{
			fmt.Sprintf(`leader_election_master_status{name="%s"} 1`, opts.LeaderElectionID),
			// Time requests waited for the client's own QPS limit.
			"rest_client_rate_limiter_duration_seconds_count",
		} {
			if !strings.Contains(body, want) {
				return fmt.Errorf("metrics lack %s", want)
			}
		}
		return nil
	})
}

func TestStandbyTakesOverWhenLeaderStops(t *testing.T) {
	var firstRuns, secondRuns atomic.Int32
	optsA := testenv.ManagerOptions(t)
	optsA.LeaderElectionID = "loom-failover"
	optsB := testenv.ManagerOptions(t)
	optsB.LeaderElectionID = "loom-failover"

	regA, regB := &manager.Registry{}, &manager.Registry{}
	regA.Add("counter", leaderCounter(&firstRuns))
	regB.Add("counter", leaderCounter(&secondRuns))

	a := env.StartManager(t, optsA, regA)
	waitElected(t, a, 30*time.Second)
	b := env.StartManager(t, optsB, regB)
	// The standby is ready (warm caches) but does not lead.
	testenv.Eventually(t, 30*time.Second, func() error { return expectStatus(b.ProbeURL+"/readyz", "", http.StatusOK) })
	select {
	case <-b.Elected():
		t.Fatal("second instance became leader while the first holds the lease")
	case <-time.After(3 * optsB.RetryPeriod):
	}
	if secondRuns.Load() != 0 {
		t.Fatal("standby started a leader-only controller")
	}

	stopped := time.Now()
	if err := a.Stop(); err != nil {
		t.Fatalf("stopping the leader: %v", err)
	}
	waitElected(t, b, 2*optsB.LeaseDuration)
	t.Logf("standby took over %s after the leader stopped", time.Since(stopped).Round(time.Millisecond))
	testenv.Eventually(t, 10*time.Second, func() error {
		if secondRuns.Load() != 1 {
			return fmt.Errorf("standby's controller started %d times", secondRuns.Load())
		}
		return nil
	})
	if firstRuns.Load() != 1 {
		t.Fatalf("first leader's controller started %d times", firstRuns.Load())
	}
}

func TestManagerRejectsUnknownController(t *testing.T) {
	opts := testenv.ManagerOptions(t)
	opts.Controllers = "bogus"
	reg := &manager.Registry{}
	reg.Add("gpu", leaderCounter(new(atomic.Int32)))
	_, _, err := manager.New(context.Background(), env.Config, opts, reg)
	if err == nil || !strings.Contains(err.Error(), `unknown controller(s) "bogus"`) || !strings.Contains(err.Error(), "valid names: gpu") {
		t.Fatalf("error = %v", err)
	}
}

func waitElected(t *testing.T, m *testenv.Manager, timeout time.Duration) {
	t.Helper()
	select {
	case <-m.Elected():
	case <-time.After(timeout):
		t.Fatalf("manager not elected within %s", timeout)
	}
}

// serviceAccountToken creates a service account and returns a token for it;
// withMetrics binds it to a ClusterRole allowing GET /metrics.
func serviceAccountToken(t *testing.T, ns, name string, withMetrics bool) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := client.IgnoreAlreadyExists(env.Client.Create(ctx, sa)); err != nil {
		t.Fatal(err)
	}
	if withMetrics {
		role := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "test-" + name},
			Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
		}
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "test-" + name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
		}
		for _, o := range []client.Object{role, binding} {
			if err := client.IgnoreAlreadyExists(env.Client.Create(ctx, o)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cs := kubernetes.NewForConfigOrDie(env.Config)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", name, err)
	}
	return tr.Status.Token
}

var insecure = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // self-signed test endpoint
}

func get(url, token string, want int) (string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := insecure.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return "", fmt.Errorf("GET %s: status %d, want %d: %.200s", url, resp.StatusCode, want, body)
	}
	return string(body), nil
}

func expectStatus(url, token string, want int) error {
	_, err := get(url, token, want)
	return err
}
