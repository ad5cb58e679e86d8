package manager

import (
	"sync"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	monitoringv1alpha1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1alpha1"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
)

// Scheme returns the scheme every Loom client and cache uses: Kubernetes'
// built-in kinds, Loom's own kinds, CRDs (to notice optional dependencies
// appear), and the third-party kinds Loom writes, reads or reconciles
// (Volcano PodGroups, Prometheus Operator monitors, Prometheus and
// PrometheusAgent objects, KubeRay's RayCluster).
//
// It is client-go's global scheme with Loom's kinds added, once: client-go
// builds that scheme of every built-in kind at start whatever Loom does
// (its typed clients, event recorder and leader election use it), and a
// second, private copy of it held another 600 KB of heap (GODEBUG=inittrace
// counts 670 KB for client-go's). Nothing registers a kind of another type
// under one of these names, so sharing it changes no lookup.
func Scheme() *runtime.Scheme {
	schemeOnce.Do(func() {
		s := clientgoscheme.Scheme
		utilruntime.Must(apiextensionsv1.AddToScheme(s))
		utilruntime.Must(schedulingv1beta1.AddToScheme(s))
		utilruntime.Must(monitoringv1.AddToScheme(s))
		utilruntime.Must(monitoringv1alpha1.AddToScheme(s))
		utilruntime.Must(rayv1.AddToScheme(s))
		utilruntime.Must(gpuv1alpha1.AddToScheme(s))
		utilruntime.Must(trainingv1alpha1.AddToScheme(s))
	})
	return clientgoscheme.Scheme
}

var schemeOnce sync.Once
