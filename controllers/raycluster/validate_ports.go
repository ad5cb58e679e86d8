package raycluster

// The ports a cluster's Services and Ingress expose, and the head port its
// workers dial, checked against what the head Service will have.

import (
	"cmp"
	"context"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/common"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// headPort: the head's rayStartParams port (6379 when unset), where its
// GCS listens and the workers' ray start --address dials it through the
// head Service, is a port number, and a head Service that is not headless
// (a serviceType or headService with a cluster IP) forwards it: the head
// Service's ports are the head container's (KubeRay's defaults when it
// names none) and the headService's, never rayStartParams', so otherwise
// the workers never join and nothing says why.
func headPort(rc *rayv1.RayCluster, ps *problems) {
	path := field.NewPath("spec", "headGroupSpec", "rayStartParams").Key("port")
	v := common.GetHeadPort(rc.Spec.HeadGroupSpec.RayStartParams)
	port, err := strconv.Atoi(v)
	if err != nil || port < 1 || port > math.MaxUint16 {
		ps.add(path, "%s is no port number (1-65535)", quoted(v))
		return
	}
	if len(rc.Spec.HeadGroupSpec.Template.Spec.Containers) == 0 {
		return // KubeRay's validator says so
	}
	ctx := log.IntoContext(context.Background(), logr.Discard())
	svc, err := common.BuildServiceForHeadPod(ctx, *rc, common.HeadServiceLabels(*rc), nil)
	if err != nil || svc.Spec.ClusterIP == corev1.ClusterIPNone ||
		slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return int(p.Port) == port }) {
		return
	}
	ps.add(path, "the workers dial the head Service (type %s) at port %d, which it lacks: give the head container a port %d (named %s), or the headService one",
		cmp.Or(string(svc.Spec.Type), string(corev1.ServiceTypeClusterIP)), port, port, utils.GcsServerPortName)
}

// exposed: with the ray.io/enable-serve-service annotation, the head
// container has the port named serve that the serve Service serves on
// (KubeRay's default ports, when the container names none, have it;
// KubeRay refuses to build the Service without it); with
// spec.headGroupSpec.enableIngress, the kubernetes.io/ingress.class
// annotation, the Ingress's class, is a name an IngressClass can have,
// and the head Service has the port the Ingress sends to (see
// dashboardPort).
func exposed(rc *rayv1.RayCluster, ps *problems) {
	if rc.Annotations[utils.EnableServeServiceKey] == utils.EnableServeServiceTrue {
		if cs := rc.Spec.HeadGroupSpec.Template.Spec.Containers; len(cs) > 0 && len(cs[0].Ports) > 0 &&
			!slices.ContainsFunc(cs[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == utils.ServingPortName }) {
			ps.add(field.NewPath("spec", "headGroupSpec", "template", "spec", "containers").Index(0).Child("ports"),
				"no port is named %s, which the serve Service the annotation %s=true asks for serves on: name the Ray Serve port (8000) %s, or remove the annotation",
				utils.ServingPortName, utils.EnableServeServiceKey, utils.ServingPortName)
		}
	}
	if !ptr.Deref(rc.Spec.HeadGroupSpec.EnableIngress, false) {
		return
	}
	if class, ok := rc.Annotations[common.IngressClassAnnotationKey]; ok {
		if errs := validation.IsDNS1123Subdomain(class); len(errs) > 0 {
			ps.add(field.NewPath("metadata", "annotations").Key(common.IngressClassAnnotationKey), "%s, the Ingress's class, is no IngressClass name: %s", quoted(class), strings.Join(errs, "; "))
		}
	}
	dashboardPort(rc, ps)
}

// dashboardPort: the Ingress sends to the head Service's port named
// dashboard, else to port 8265 (KubeRay's builder), which a head container
// that names its ports without a dashboard port may not give the head
// Service: then the dashboard behind the Ingress is unreachable, which
// nothing else would say.
func dashboardPort(rc *rayv1.RayCluster, ps *problems) {
	cs := rc.Spec.HeadGroupSpec.Template.Spec.Containers
	if len(cs) == 0 || len(cs[0].Ports) == 0 ||
		slices.ContainsFunc(cs[0].Ports, func(p corev1.ContainerPort) bool {
			return p.Name == utils.DashboardPortName || p.ContainerPort == utils.DefaultDashboardPort
		}) {
		return
	}
	if hs := rc.Spec.HeadGroupSpec.HeadService; hs != nil &&
		slices.ContainsFunc(hs.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == utils.DefaultDashboardPort }) {
		return
	}
	ps.add(field.NewPath("spec", "headGroupSpec", "template", "spec", "containers").Index(0).Child("ports"),
		"no port is named %s, and none is %d, the head Service's port the Ingress spec.headGroupSpec.enableIngress asks for sends to: name the Ray dashboard port (%d) %s, or turn enableIngress off",
		utils.DashboardPortName, utils.DefaultDashboardPort, utils.DefaultDashboardPort, utils.DashboardPortName)
}
