package crdinstall

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const smallCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: things.example.com
  annotations: {team: ml}
spec:
  group: example.com
  names: {kind: Thing, plural: things}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, description: "ünïcode & <html>"}}}]
`

// A CRD's hash is the one computed when its manifest was packed, else its
// pack's JSON's.
func TestCRDHash(t *testing.T) {
	packed, hash, err := Pack([]byte(smallCRD))
	if err != nil {
		t.Fatal(err)
	}
	if got := (CRD{Packed: packed}).Hash(); got != hash || len(got) != 16 {
		t.Errorf("without a precomputed hash: %q, want Pack's %q (16 hex digits)", got, hash)
	}
	if got := (CRD{Packed: packed, ManifestHash: "0123456789abcdef"}).Hash(); got != "0123456789abcdef" {
		t.Errorf("with a precomputed hash: %q, want it", got)
	}
	if got := (CRD{Packed: []byte("not gzip")}).Hash(); got != "" {
		t.Errorf("a pack that does not unpack hashes to %q, want empty", got)
	}
}

// A pack unpacks to the manifest's JSON, the same bytes every time (make
// verify regenerates the packs and fails on any difference); what is not a
// CRD manifest is refused.
func TestPack(t *testing.T) {
	packed, hash, err := Pack([]byte(smallCRD))
	if err != nil {
		t.Fatal(err)
	}
	again, _, _ := Pack([]byte(smallCRD))
	if !bytes.Equal(packed, again) {
		t.Error("two packs of one manifest differ")
	}
	got, err := Unpack(packed)
	if err != nil {
		t.Fatal(err)
	}
	if Hash(got) != hash {
		t.Errorf("Pack's hash %s is not its JSON's %s", hash, Hash(got))
	}
	var have, want any
	if err := json.Unmarshal(got, &have); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(smallCRD), &want); err != nil {
		t.Fatal(err)
	}
	if a, b := mustJSON(t, have), mustJSON(t, want); a != b {
		t.Errorf("unpacked %s, want %s", a, b)
	}

	for name, bad := range map[string]string{
		"not YAML":           "kind: [",
		"another kind":       strings.Replace(smallCRD, "kind: CustomResourceDefinition", "kind: ConfigMap", 1),
		"another version":    strings.Replace(smallCRD, "apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1", 1),
		"a status":           smallCRD + "status: {acceptedNames: {kind: Thing}}\n",
		"two documents":      smallCRD + "---\n" + smallCRD,
		"a list of CRDs":     "- " + strings.ReplaceAll(smallCRD, "\n", "\n  "),
		"an empty manifest":  "",
		"metadata not a map": strings.Replace(smallCRD, "metadata:\n  name: things.example.com\n  annotations: {team: ml}", "metadata: things", 1),
	} {
		if _, _, err := Pack([]byte(bad)); err == nil {
			t.Errorf("%s: packed", name)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Verify passes a pack of its source with its hash, and fails a pack of
// another source, of another CRD's name, or with a stale hash.
func TestVerify(t *testing.T) {
	packed, hash, err := Pack([]byte(smallCRD))
	if err != nil {
		t.Fatal(err)
	}
	good := CRD{Name: "things.example.com", Packed: packed, ManifestHash: hash}
	if err := Verify(good, []byte(smallCRD)); err != nil {
		t.Fatalf("a current pack: %v", err)
	}
	changed := strings.Replace(smallCRD, "team: ml", "team: infra", 1)
	stale := good
	stale.ManifestHash = "0123456789abcdef"
	renamed := good
	renamed.Name = "others.example.com"
	for name, tc := range map[string]struct {
		crd    CRD
		source string
	}{
		"a changed source": {good, changed},
		"a stale hash":     {stale, smallCRD},
		"another name":     {renamed, smallCRD},
		"not a pack":       {CRD{Name: good.Name, Packed: []byte("{}")}, smallCRD},
	} {
		if err := Verify(tc.crd, []byte(tc.source)); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}
