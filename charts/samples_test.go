package charts

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/testenv"
)

// The samples the README and the demo use are accepted as written by the
// API server with Loom's CRDs (strict decoding: no field the types lack,
// then CEL validation on create).
func TestSamplesAreAccepted(t *testing.T) {
	ctx := context.Background()
	env, err := testenv.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	for file, obj := range map[string]client.Object{
		"trainingjob-pytorch.yaml": &trainingv1alpha1.TrainingJob{},
		"raycluster-gpu.yaml":      &rayv1.RayCluster{},
	} {
		b, err := os.ReadFile(filepath.Join("..", "config", "samples", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, obj); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if obj.GetNamespace() == "" {
			obj.SetNamespace("default")
		}
		if err := env.CreateNamespace(ctx, obj.GetNamespace()); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Errorf("%s: %v", file, err)
		}
	}
}
