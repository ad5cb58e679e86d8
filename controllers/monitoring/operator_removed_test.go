package monitoring

import (
	"fmt"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/testenv"
)

// TestOperatorCRDRemovedWhileRunning: the Prometheus Operator uninstalled
// (its PrometheusRule CRD deleted, and with it Loom's rules) while the
// manager runs is said in the condition, without a crash, from the moment
// the CRD terminates (held by an object's finalizer, it refuses creates):
// no write retried against it; installed again, the rules are written
// again, without a restart.
func TestOperatorCRDRemovedWhileRunning(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t)
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	rule := &monitoringv1.PrometheusRule{ObjectMeta: key(loomNS, RuleName)}
	exists(t, rule)
	policyCondition(t, cp, ReasonNoPrometheus)

	// A rule of someone else's with a finalizer holds the CRD terminating:
	// the API server refuses every create of its kind meanwhile.
	held := &monitoringv1.PrometheusRule{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: "held", Finalizers: []string{"example.com/hold"}}}
	if err := env.Client.Create(ctx(), held); err != nil {
		t.Fatal(err)
	}
	const name = "prometheusrules.monitoring.coreos.com"
	if err := env.Client.Delete(ctx(), &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.InstallCRDsNamed(ctx(), name); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() {
		_ = env.Client.Patch(ctx(), held, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
	})
	gone(t, rule)
	gotCondition := func() {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() error {
			c := policyCondition(t, cp, ReasonNoPrometheus)
			if !strings.Contains(c.Message, "no PrometheusRule CRD ("+name+") is installed") {
				return fmt.Errorf("condition %q does not say the rules' CRD is gone", c.Message)
			}
			return nil
		})
	}
	// Terminating: as good as gone, not a write failing over and over.
	gotCondition()
	time.Sleep(3 * time.Second)
	gotCondition()
	if err := env.Client.Get(ctx(), client.ObjectKeyFromObject(rule), rule); !apierrors.IsNotFound(err) {
		t.Fatalf("Loom's rule while its CRD terminates: %v", err)
	}
	release := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
	if err := env.Client.Patch(ctx(), held, release); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, func() error {
		err := env.Client.Get(ctx(), client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("CRD still there: %v", err)
	})
	gotCondition()

	installed := time.Now()
	if err := env.InstallCRDsNamed(ctx(), name); err != nil {
		t.Fatal(err)
	}
	exists(t, rule)
	t.Logf("rules written again %.1fs after their CRD came back", time.Since(installed).Seconds())
	testenv.Eventually(t, 20*time.Second, func() error {
		c := policyCondition(t, cp, ReasonNoPrometheus)
		if strings.Contains(c.Message, "no PrometheusRule CRD") {
			return fmt.Errorf("condition %q still says the rules' CRD is gone", c.Message)
		}
		return nil
	})
}
