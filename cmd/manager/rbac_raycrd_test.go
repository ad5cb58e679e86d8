package main

import (
	"context"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// TestChartRBACInstallsKubeRaysCRDs starts the Ray controllers on an API
// server that serves none of KubeRay's CRDs, with exactly the rights the
// chart gives the manager: with rayCluster.installCRD (the default) they
// apply the RayCluster and RayJob CRDs; with it off the chart grants no
// CRD writes and the controllers stay off without trying one.
func TestChartRBACInstallsKubeRaysCRDs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := testenv.StartWithout(ctx, "ray.io")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	must(t, env.CreateNamespace(ctx, rbacNS))
	names := []string{"rayclusters.ray.io", "rayjobs.ray.io"}

	for _, tc := range []struct {
		set     string
		install bool
	}{
		{set: "rayCluster.installCRD=false"},
		{set: "rayCluster.installCRD=true", install: true},
	} {
		t.Run(tc.set, func(t *testing.T) {
			objs, err := testenv.RenderChart(rbacNS, tc.set, "manager.applyCRDs=false")
			must(t, err)
			var rbac []*unstructured.Unstructured
			for _, o := range objs {
				if o.GetAPIVersion() == "rbac.authorization.k8s.io/v1" || o.GetKind() == "ServiceAccount" {
					rbac = append(rbac, o)
				}
			}
			must(t, testenv.Apply(ctx, env.Config, env.Client, rbac))
			var refused forbidden
			opts := testenv.ManagerOptions(t)
			opts.Namespace = rbacNS
			opts.Controllers = "raycluster,rayjob"
			opts.InstallRayCRD = tc.install
			opts.ApplyCRDs = false
			if _, _, err := manager.New(ctx, asServiceAccount(env.Config, "loom-manager", "", &refused), opts, registry()); err != nil {
				t.Fatalf("manager: %v", err)
			}
			if got := refused.list(); len(got) > 0 {
				t.Fatalf("the chart's RBAC refused:\n%s", strings.Join(got, "\n"))
			}
			for _, name := range names {
				err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{})
				switch {
				case tc.install && err != nil:
					t.Errorf("CRD %s: %v", name, err)
				case !tc.install && !apierrors.IsNotFound(err):
					t.Errorf("CRD %s with rayCluster.installCRD=false: want none, got %v", name, err)
				}
			}
		})
	}
}
