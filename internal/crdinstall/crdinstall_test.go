package crdinstall_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/internal/crdinstall"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

const (
	group = "crdinstall.loom.test"
	owner = "loom-test-crd"
)

// manifest is a small CRD <plural>.crdinstall.loom.test whose spec has the
// given string fields: a later Loom's copy adds one.
func manifest(plural string, fields ...string) []byte {
	var props strings.Builder
	for _, f := range fields {
		fmt.Fprintf(&props, "                  %s: {type: string}\n", f)
	}
	kind := strings.ToUpper(plural[:1]) + strings.TrimSuffix(plural[1:], "s")
	return []byte(fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[1]s.%[2]s
spec:
  group: %[2]s
  names: {kind: %[3]s, listKind: %[3]sList, plural: %[1]s, singular: %[4]s}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
%[5]s`, plural, group, kind, strings.ToLower(kind), props.String()))
}

func crdOf(plural string, fields ...string) crdinstall.CRD {
	return crdinstall.CRD{Name: plural + "." + group, Packed: pack(manifest(plural, fields...)), FieldOwner: owner}
}

// pack is crdinstall.Pack's pack of a manifest that must pack.
func pack(m []byte) []byte {
	packed, _, err := crdinstall.Pack(m)
	if err != nil {
		panic(err)
	}
	return packed
}

func ensure(t *testing.T, crd crdinstall.CRD, install bool) bool {
	t.Helper()
	present, err := crdinstall.Ensure(context.Background(), env.Config, env.Client, env.Client, crd, install)
	if err != nil {
		t.Fatalf("Ensure(%s, install=%v): %v", crd.Name, install, err)
	}
	return present
}

func get(t *testing.T, name string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	have := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, have); err != nil {
		t.Fatal(err)
	}
	return have
}

// fields are the spec fields the served CRD's schema has.
func fields(t *testing.T, name string) []string {
	t.Helper()
	var out []string
	for f := range get(t, name).Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties {
		out = append(out, f)
	}
	return out
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// Absent and not to be installed, the CRD stays absent and Ensure says so.
func TestAbsentWithoutInstall(t *testing.T) {
	crd := crdOf("absents", "a")
	if ensure(t, crd, false) {
		t.Fatal("Ensure reports an absent CRD present")
	}
	err := env.Client.Get(context.Background(), client.ObjectKey{Name: crd.Name}, &apiextensionsv1.CustomResourceDefinition{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("CRD after Ensure without install: %v, want NotFound", err)
	}
}

// Absent, it is applied as FieldOwner and Ensure returns once it is
// established.
func TestAbsentIsInstalled(t *testing.T) {
	crd := crdOf("installs", "a")
	if !ensure(t, crd, true) {
		t.Fatal("Ensure reports the CRD it installed absent")
	}
	have := get(t, crd.Name)
	if !established(have) {
		t.Fatalf("CRD not established when Ensure returned: %+v", have.Status.Conditions)
	}
	if !crdinstall.AppliedBy(have, owner) {
		t.Fatalf("CRD not applied by %s: %+v", owner, have.ManagedFields)
	}
}

// A copy Loom applied before is re-applied with the embedded (newer)
// manifest when install is on, and left as it is when install is off.
func TestLoomsOlderCopyIsUpgraded(t *testing.T) {
	older, newer := crdOf("upgrades", "a"), crdOf("upgrades", "a", "b")
	ensure(t, older, true)
	if !ensure(t, newer, false) {
		t.Fatal("Ensure without install reports Loom's copy absent")
	}
	if got := fields(t, newer.Name); len(got) != 1 {
		t.Fatalf("Loom's copy upgraded with install off: spec fields %v", got)
	}
	if !ensure(t, newer, true) {
		t.Fatal("Ensure reports the upgraded CRD absent")
	}
	if got := fields(t, newer.Name); len(got) != 2 {
		t.Fatalf("Loom's older copy not upgraded: spec fields %v, want a and b", got)
	}
}

// A CRD someone else installed (KubeRay's own chart) is left alone, even
// with install on and a newer embedded manifest.
func TestSomeoneElsesCRDIsLeftAlone(t *testing.T) {
	theirs := crdOf("foreigns", "a")
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(manifest("foreigns", "a"), &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(context.Background(), u, client.FieldOwner("helm")); err != nil {
		t.Fatal(err)
	}
	// The API server's own status writes (Established) come first.
	if err := testenv.WaitForCRDs(context.Background(), env.Config, theirs.Name); err != nil {
		t.Fatal(err)
	}
	before := get(t, theirs.Name).ResourceVersion
	for _, install := range []bool{true, false} {
		if !ensure(t, crdOf("foreigns", "a", "b"), install) {
			t.Fatalf("Ensure(install=%v) reports someone else's CRD absent", install)
		}
	}
	have := get(t, theirs.Name)
	if have.ResourceVersion != before || crdinstall.AppliedBy(have, owner) {
		t.Fatalf("someone else's CRD was written: resourceVersion %s -> %s, managers %+v", before, have.ResourceVersion, have.ManagedFields)
	}
}

// A manifest that is not the CRD named is refused before anything is
// written.
func TestManifestOfAnotherCRDIsRefused(t *testing.T) {
	crd := crdOf("mismatches", "a")
	crd.Packed = pack(manifest("others", "a"))
	if _, err := crdinstall.Ensure(context.Background(), env.Config, env.Client, env.Client, crd, true); err == nil {
		t.Fatal("Ensure applied a manifest of another CRD")
	}
	for _, name := range []string{crd.Name, "others." + group} {
		err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{})
		if !apierrors.IsNotFound(err) {
			t.Fatalf("CRD %s after a refused Ensure: %v, want NotFound", name, err)
		}
	}
}

// Loom's copy of this very manifest is not applied again: a restart
// writes nothing. One an earlier Loom applied without the content hash is
// applied once more, and carries it after.
func TestLoomsCurrentCopyIsNotRewritten(t *testing.T) {
	crd := crdOf("currents", "a")
	ensure(t, crd, true)
	have := get(t, crd.Name)
	if got := have.Annotations[crdinstall.AnnotationHash]; got != crd.Hash() {
		t.Fatalf("%s after Ensure is %q, want %q", crdinstall.AnnotationHash, got, crd.Hash())
	}
	before, applies := have.ResourceVersion, applied(t)
	for range 2 {
		if !ensure(t, crd, true) {
			t.Fatal("Ensure reports Loom's current copy absent")
		}
	}
	if n := applied(t) - applies; n != 0 {
		t.Fatalf("Loom's current copy was applied %v more times", n)
	}
	if after := get(t, crd.Name).ResourceVersion; after != before {
		t.Fatalf("Loom's current copy was written again: resourceVersion %s -> %s", before, after)
	}

	// An earlier Loom's copy: applied as FieldOwner, no hash.
	legacy := crdOf("legacies", "a")
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(manifest("legacies", "a"), &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(owner), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitForCRDs(context.Background(), env.Config, legacy.Name); err != nil {
		t.Fatal(err)
	}
	ensure(t, legacy, true)
	if got := get(t, legacy.Name).Annotations[crdinstall.AnnotationHash]; got != legacy.Hash() {
		t.Fatalf("an earlier Loom's copy after Ensure: %s %q, want %q", crdinstall.AnnotationHash, got, legacy.Hash())
	}
}

// applied is how many CRD applies loom_writes_total has counted for owner.
func applied(t *testing.T) float64 {
	t.Helper()
	return testenv.WritesCounted(t, "CustomResourceDefinition", owner, "apply", "written")
}

// WaitEstablished reads a CRD's conditions only: one that exists and is
// served passes, one that does not exist yet is waited for until the
// context ends, with the CRD named in the error.
func TestWaitEstablishedReadsConditions(t *testing.T) {
	ctx := context.Background()
	if err := crdinstall.WaitEstablished(ctx, env.Config, "trainingjobs.training.loom.dev"); err != nil {
		t.Fatalf("an installed CRD: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err := crdinstall.WaitEstablished(short, env.Config, "absents.example.com")
	if err == nil || !strings.Contains(err.Error(), "absents.example.com not established") {
		t.Fatalf("an absent CRD: got %v", err)
	}
}
