package raycluster

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/testenv"
)

// The dashboard Ingress takes the cluster's annotations that are for an
// Ingress, whatever its controller, not those that say something of the
// cluster itself.
func TestForIngress(t *testing.T) {
	for key, want := range map[string]bool{
		"nginx.ingress.kubernetes.io/rewrite-target":  true,
		"alb.ingress.kubernetes.io/scheme":            true,
		"kubernetes.io/ingress.global-static-ip-name": true,
		"cert-manager.io/cluster-issuer":              true,
		"external-dns.alpha.kubernetes.io/hostname":   true,
		"team": true,
		"kubectl.kubernetes.io/last-applied-configuration": false,
		"kubectl.kubernetes.io/restartedAt":                false,
		"ray.io/enable-serve-service":                      false,
		"ray.io/ft-enabled":                                false,
		"loom.dev/applied-hash":                            false,
		"monitoring.loom.dev/scrape":                       false,
		"ray.loom.dev/cluster-uid":                         false,
		"meta.helm.sh/release-name":                        false,
		"argocd.argoproj.io/tracking-id":                   false,
		"notloom.dev/x":                                    true,
	} {
		if got := forIngress(key); got != want {
			t.Errorf("forIngress(%q) = %v, want %v", key, got, want)
		}
	}
}

// The ray.io/enable-serve-service annotation makes KubeRay's serve Service
// and headGroupSpec.enableIngress its dashboard Ingress, both controlled by
// the cluster; a pass that changes neither writes neither, and an edit of
// the cluster's annotations reaches the Ingress. The Ingress carries the
// cluster's annotations for it (an Ingress controller's, cert-manager's),
// not those of the cluster itself (kubectl's last-applied configuration,
// KubeRay's ray.io options, Loom's, Helm's and Argo CD's marks), and an
// edit of those does not write it.
func TestServeServiceAndIngress(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "ray-serve")
	rc.Annotations = map[string]string{"ray.io/enable-serve-service": "true", "kubernetes.io/ingress.class": "nginx",
		"nginx.ingress.kubernetes.io/rewrite-target": "/$1", "cert-manager.io/cluster-issuer": "letsencrypt", "team": "a",
		corev1.LastAppliedConfigAnnotation: `{"kind":"RayCluster"}`, "monitoring.loom.dev/scrape": "true",
		"meta.helm.sh/release-name": "ray", "argocd.argoproj.io/tracking-id": "ray:ray.io/RayCluster:ray-serve/raycluster-kuberay"}
	rc.Spec.HeadGroupSpec.EnableIngress = ptr.To(true)
	head := &rc.Spec.HeadGroupSpec.Template.Spec.Containers[0]
	head.Ports = append(head.Ports, corev1.ContainerPort{Name: "serve", ContainerPort: 8000})
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	created := get(t, rc)
	controlled := func(o metav1.Object) error {
		if !metav1.IsControlledBy(o, created) {
			return fmt.Errorf("%s is not controlled by the cluster: %v", o.GetName(), o.GetOwnerReferences())
		}
		return nil
	}

	svc, ing := &corev1.Service{}, &networkingv1.Ingress{}
	svcKey := client.ObjectKey{Namespace: rc.Namespace, Name: "raycluster-kuberay-serve-svc"}
	ingKey := client.ObjectKey{Namespace: rc.Namespace, Name: "raycluster-kuberay-head-ingress"}
	testenv.Eventually(t, 30*time.Second, func() error {
		if err := env.Client.Get(ctx, svcKey, svc); err != nil {
			return err
		}
		return env.Client.Get(ctx, ingKey, ing)
	})
	if err := controlled(svc); err != nil {
		t.Fatal(err)
	}
	if err := controlled(ing); err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "serve" || svc.Spec.Ports[0].Port != 8000 ||
		len(svc.Spec.Selector) != 1 || svc.Spec.Selector["ray.io/cluster"] != rc.Name || svc.Labels["ray.io/serve"] != "raycluster-kuberay-serve" {
		t.Fatalf("serve Service ports %v selector %v labels %v", svc.Spec.Ports, svc.Spec.Selector, svc.Labels)
	}
	wantAnnotations := map[string]string{"nginx.ingress.kubernetes.io/rewrite-target": "/$1", "cert-manager.io/cluster-issuer": "letsencrypt", "team": "a"}
	gotAnnotations := maps.Clone(ing.Annotations)
	delete(gotAnnotations, apply.AnnotationHash)
	if ptr.Deref(ing.Spec.IngressClassName, "") != "nginx" || !maps.Equal(gotAnnotations, wantAnnotations) {
		t.Fatalf("Ingress class %v annotations %v, want %v", ing.Spec.IngressClassName, gotAnnotations, wantAnnotations)
	}
	if r := ing.Spec.Rules; len(r) != 1 || r[0].HTTP == nil || len(r[0].HTTP.Paths) != 1 {
		t.Fatalf("Ingress rules %+v", r)
	}
	p := ing.Spec.Rules[0].HTTP.Paths[0]
	if p.Path != "/raycluster-kuberay/(.*)" || p.Backend.Service == nil || p.Backend.Service.Name != "raycluster-kuberay-head-svc" || p.Backend.Service.Port.Number != 8265 {
		t.Fatalf("Ingress path %+v", p)
	}

	// Passes that change neither (pods ready, a label edit, kubectl's
	// annotation) write neither.
	pods := waitPods(t, rc, map[string]int{"headgroup": 1, "workergroup": 1})
	ready(t, pods["headgroup"][0], pods["workergroup"][0])
	waitState(t, rc, rayv1.Ready)
	update(t, rc, func(c *rayv1.RayCluster) {
		c.Labels = map[string]string{"team": "a"}
		c.Annotations[corev1.LastAppliedConfigAnnotation] = `{"kind":"RayCluster","metadata":{"labels":{"team":"a"}}}`
	})
	time.Sleep(2 * time.Second)
	again, againIng := &corev1.Service{}, &networkingv1.Ingress{}
	if err := env.Client.Get(ctx, svcKey, again); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, ingKey, againIng); err != nil {
		t.Fatal(err)
	}
	if again.ResourceVersion != svc.ResourceVersion || againIng.ResourceVersion != ing.ResourceVersion {
		t.Fatalf("rewritten by passes that change nothing: Service %s -> %s, Ingress %s -> %s",
			svc.ResourceVersion, again.ResourceVersion, ing.ResourceVersion, againIng.ResourceVersion)
	}

	update(t, rc, func(c *rayv1.RayCluster) { c.Annotations["nginx.ingress.kubernetes.io/rewrite-target"] = "/$2" })
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := env.Client.Get(ctx, ingKey, ing); err != nil {
			return err
		}
		if v := ing.Annotations["nginx.ingress.kubernetes.io/rewrite-target"]; v != "/$2" {
			return fmt.Errorf("Ingress rewrite-target %q after the cluster's edit", v)
		}
		return nil
	})
}

// Turning the serve Service and the Ingress off deletes them; an object of
// their names that Loom made for no one, or that another object controls,
// is left alone.
func TestTurnedOffServeServiceAndIngressGo(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "ray-serve-off")
	rc.Annotations = map[string]string{"ray.io/enable-serve-service": "true"}
	rc.Spec.HeadGroupSpec.EnableIngress = ptr.To(true)
	head := &rc.Spec.HeadGroupSpec.Template.Spec.Containers[0]
	head.Ports = append(head.Ports, corev1.ContainerPort{Name: "serve", ContainerPort: 8000})
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	svcKey := client.ObjectKey{Namespace: rc.Namespace, Name: "raycluster-kuberay-serve-svc"}
	ingKey := client.ObjectKey{Namespace: rc.Namespace, Name: "raycluster-kuberay-head-ingress"}
	testenv.Eventually(t, 30*time.Second, func() error {
		if err := env.Client.Get(ctx, svcKey, &corev1.Service{}); err != nil {
			return err
		}
		return env.Client.Get(ctx, ingKey, &networkingv1.Ingress{})
	})
	update(t, rc, func(c *rayv1.RayCluster) {
		delete(c.Annotations, "ray.io/enable-serve-service")
		c.Spec.HeadGroupSpec.EnableIngress = ptr.To(false)
	})
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, o := range []client.Object{&corev1.Service{}, &networkingv1.Ingress{}} {
			key := svcKey
			if _, ok := o.(*networkingv1.Ingress); ok {
				key = ingKey
			}
			if err := env.Client.Get(ctx, key, o); err == nil && o.GetDeletionTimestamp() == nil {
				return fmt.Errorf("%s is still there after the cluster turned it off", key.Name)
			} else if client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		return nil
	})

	// Objects of the names that the cluster does not control, in the
	// cache (Loom's label): one controlled by no one, one by a ConfigMap.
	other := sample(t, "ray-cluster.sample.yaml", "ray-serve-kept")
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: other.Namespace}}
	if err := env.Client.Create(ctx, owner); err != nil {
		t.Fatal(err)
	}
	loom := map[string]string{"app.kubernetes.io/managed-by": "loom"}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcKey.Name, Namespace: other.Namespace, Labels: loom},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "serve", Port: 8000}}}}
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: ingKey.Name, Namespace: other.Namespace, Labels: loom,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(owner, corev1.SchemeGroupVersion.WithKind("ConfigMap"))}},
		Spec: networkingv1.IngressSpec{DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
			Name: "x", Port: networkingv1.ServiceBackendPort{Number: 80}}}}}
	for _, o := range []client.Object{svc, ing} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	// A pass creates the pods after it has settled the children.
	waitPods(t, other, map[string]int{"headgroup": 1, "workergroup": 1})
	for _, o := range []client.Object{&corev1.Service{}, &networkingv1.Ingress{}} {
		key := client.ObjectKey{Namespace: other.Namespace, Name: svcKey.Name}
		if _, ok := o.(*networkingv1.Ingress); ok {
			key.Name = ingKey.Name
		}
		if err := env.Client.Get(ctx, key, o); err != nil || o.GetDeletionTimestamp() != nil {
			t.Fatalf("%s not controlled by the cluster was deleted: %v", key.Name, err)
		}
	}
}

// A head Service renamed through spec.headGroupSpec.headService replaces
// the one of the old name, which goes.
func TestRenamedHeadServiceGoes(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "ray-head-rename")
	rc.Spec.HeadGroupSpec.HeadService = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "head-a"}}
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: rc.Namespace, Name: name} }
	testenv.Eventually(t, 30*time.Second, func() error { return env.Client.Get(ctx, key("head-a"), &corev1.Service{}) })
	update(t, rc, func(c *rayv1.RayCluster) { c.Spec.HeadGroupSpec.HeadService.Name = "head-b" })
	testenv.Eventually(t, 30*time.Second, func() error {
		if err := env.Client.Get(ctx, key("head-b"), &corev1.Service{}); err != nil {
			return err
		}
		old := &corev1.Service{}
		if err := env.Client.Get(ctx, key("head-a"), old); err == nil && old.DeletionTimestamp == nil {
			return fmt.Errorf("the head Service of the old name is still there")
		} else if client.IgnoreNotFound(err) != nil {
			return err
		}
		return nil
	})
}

// The autoscaler turned off takes its ServiceAccount, Role and RoleBinding
// with it.
func TestTurnedOffAutoscalerRBACGoes(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "ray-autoscaler-off")
	rc.Spec.EnableInTreeAutoscaling = ptr.To(true)
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name}
	objs := func() []client.Object {
		return []client.Object{&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}}
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, o := range objs() {
			if err := env.Client.Get(ctx, key, o); err != nil {
				return err
			}
		}
		return nil
	})
	update(t, rc, func(c *rayv1.RayCluster) { c.Spec.EnableInTreeAutoscaling = ptr.To(false) })
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, o := range objs() {
			if err := env.Client.Get(ctx, key, o); err == nil && o.GetDeletionTimestamp() == nil {
				return fmt.Errorf("%T %s is still there after the autoscaler was turned off", o, key.Name)
			} else if client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		return nil
	})
}
