package v1alpha1

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// selectors are label selectors labels.Parse accepts (true) or rejects.
var selectors = map[string]bool{
	"":                                 true,
	"   ":                              true,
	"app":                              true,
	"!app":                             true,
	"! app":                            true,
	"app=training":                     true,
	"app = training":                   true,
	"app==training":                    true,
	"app!=training":                    true,
	"app=":                             true,
	"app=,tier":                        true,
	"app in (a,b)":                     true,
	"app in(a, b )":                    true,
	"app notin (a)":                    true,
	"app in ()":                        true,
	"app in (,)":                       true,
	"app in (a,,b)":                    true,
	"in in (in)":                       true,
	"x=in":                             true,
	"gpu>4":                            true,
	"gpu < 4":                          true,
	"example.com/app=x,!example.com/b": true,
	"a\tin\t(b)\n, c":                  true,
	"App_x.y-z=V.1_2-3":                true,
	"x in (":                           false,
	"job in (":                         false,
	"x in a":                           false,
	"xin (a)":                          false,
	"x in (a b)":                       false,
	"app,":                             false,
	",app":                             false,
	"a,,b":                             false,
	"!app=x":                           false,
	"!=x":                              false,
	"!!x":                              false,
	"x===a":                            false,
	"x=a=b":                            false,
	"x=a b":                            false,
	"x y":                              false,
	"x>":                               false,
	"x>=4":                             false,
	"x>a":                              false,
	"x>-4":                             false,
	"Example.com/app":                  false,
	"/app":                             false,
	"app/":                             false,
	"-app":                             false,
	"app=-x":                           false,
	"app=x_":                           false,
	"x IN (a)":                         false,
	"x in ((a))":                       false,
	"latest!":                          false,
	strings.Repeat("a", 64):            false,
	"a=" + strings.Repeat("b", 64):     false,
	strings.Repeat("a", 63) + "=" + strings.Repeat("b", 63): true,
}

func TestLabelSelectorPatternIsLabelsParse(t *testing.T) {
	re := regexp.MustCompile(LabelSelectorPattern)
	for s, valid := range selectors {
		_, err := labels.Parse(s)
		if (err == nil) != valid {
			t.Fatalf("test table: labels.Parse(%q) = %v", s, err)
		}
		if re.MatchString(s) != valid {
			t.Errorf("pattern matches %q: %v, labels.Parse: %v", s, !valid, err)
		}
		if _, err := ParseSelector(s); (err == nil) != valid {
			t.Errorf("ParseSelector(%q) = %v", s, err)
		}
	}
}

// FuzzLabelSelectorPattern: the pattern (the podSelector CEL rule) never
// rejects a selector labels.Parse accepts, and accepts a selector
// labels.Parse rejects only for what it leaves to Validate (a DNS prefix
// over 253 characters, an integer beyond int64).
func FuzzLabelSelectorPattern(f *testing.F) {
	for s := range selectors {
		f.Add(s)
	}
	re := regexp.MustCompile(LabelSelectorPattern)
	f.Fuzz(func(t *testing.T, s string) {
		_, err := labels.Parse(s)
		matches := re.MatchString(s)
		switch {
		case err == nil && !matches && !strings.ContainsRune(s, 0):
			t.Fatalf("pattern rejects %q, which labels.Parse accepts", s)
		case err != nil && matches && !strings.Contains(err.Error(), "253") && !strings.Contains(err.Error(), "must be an integer"):
			t.Fatalf("pattern accepts %q, which labels.Parse rejects: %v", s, err)
		}
		if _, perr := ParseSelector(s); perr == nil && (err != nil || !matches) {
			t.Fatalf("ParseSelector accepts %q (labels.Parse: %v, pattern: %v)", s, err, matches)
		}
	})
}

func TestDriverVersionPattern(t *testing.T) {
	re := regexp.MustCompile(DriverVersionPattern)
	for v, want := range map[string]bool{
		"570.172.08": true, "550.54.15": true, "580.65.06": true, "570.172.08-ubuntu22.04": true, "550.54.15-rhel9.4": true, "535.104": true,
		"latest": false, "stable": false, "v570.172.08": false, "570": false, "570.": false, ".570": false, "570.172.08-": false,
		"570-5.15.0-1040-azure-ubuntu22.04": false, "570 beta": false, "": false,
	} {
		if re.MatchString(v) != want {
			t.Errorf("driver version %q: matches %v, want %v", v, !want, want)
		}
	}
}

func TestImagePatterns(t *testing.T) {
	repo, name := regexp.MustCompile(ImageRepositoryPattern), regexp.MustCompile(ImageNamePattern)
	for r, want := range map[string]bool{
		"nvcr.io/nvidia": true, "nvcr.io/nvidia/k8s": true, "registry.example:5000/team": true, "localhost:5000": true,
		"nvidia": true, "Registry.Example.com/a__b/c-d.e": true,
		"nvcr.io/NVIDIA": false, "nvcr.io/nvidia/": false, "https://nvcr.io/nvidia": false, "nvcr.io/nvidia ": false,
		"nvcr.io//nvidia": false, "nvcr.io/nvidia:570": false, "nvcr.io:port/x": false, "-nvcr.io": false, "": false,
	} {
		if repo.MatchString(r) != want {
			t.Errorf("repository %q: matches %v, want %v", r, !want, want)
		}
	}
	for n, want := range map[string]bool{
		"driver": true, "k8s/dcgm-exporter": true, "gpu-operator-validator": true, "a__b.c": true,
		"Driver": false, "driver:570": false, "driver@sha256": false, "a..b": false, "a//b": false, "/driver": false, "driver/": false, "a___b": false,
	} {
		if name.MatchString(n) != want {
			t.Errorf("image %q: matches %v, want %v", n, !want, want)
		}
	}
}

func TestValidateNamesTheField(t *testing.T) {
	spec := ClusterPolicySpec{}
	if errs := spec.Validate(); len(errs) != 0 {
		t.Fatalf("empty spec: %v", errs)
	}
	spec.Driver.Image.Version = "latest"
	spec.Driver.UsePrecompiled = true
	spec.Driver.KernelModuleType = "nouveau"
	spec.Driver.UpgradePolicy = DriverUpgradePolicy{
		MaxParallelUpgrades: ptr.To[int32](-1),
		MaxUnavailable:      ptr.To(intstr.FromInt32(0)),
		WaitForCompletion:   &WaitForCompletionSpec{PodSelector: "job in (", TimeoutSeconds: -1},
		Drain:               &DrainSpec{PodSelector: "a,,b"},
		PodDeletion:         &PodDeletionSpec{TimeoutSeconds: -5},
	}
	spec.DaemonSets.PriorityClassName = "System Node Critical"
	spec.DaemonSets.Labels = map[string]string{"bad key!": "v", "ok": "bad value!"}
	spec.DaemonSets.Annotations = map[string]string{"no/no/no": ""}
	spec.DCGMExporter.NodeSelector = map[string]string{"nvidia.com/gpu.product": "H100 80GB"}
	spec.DCGMExporter.Image = ImageSpec{Repository: "nvcr.io/NVIDIA", Image: "dcgm exporter"}
	var got []string
	for _, e := range spec.Validate() {
		got = append(got, e.Field)
	}
	want := []string{
		"spec.driver.upgradePolicy.maxParallelUpgrades", "spec.driver.upgradePolicy.maxUnavailable",
		"spec.driver.upgradePolicy.waitForCompletion.podSelector", "spec.driver.upgradePolicy.waitForCompletion.timeoutSeconds",
		"spec.driver.upgradePolicy.podDeletion.timeoutSeconds", "spec.driver.upgradePolicy.drain.podSelector",
		"spec.driver.image.version", "spec.driver.kernelModuleType", "spec.daemonsets.priorityClassName", "spec.daemonsets.labels[bad key!]", "spec.daemonsets.labels[ok]",
		"spec.daemonsets.annotations[no/no/no]", "spec.dcgmExporter.nodeSelector[nvidia.com/gpu.product]",
		"spec.dcgmExporter.image.repository", "spec.dcgmExporter.image.image",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("fields\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, u := range []intstr.IntOrString{intstr.FromInt32(0), intstr.FromInt32(-2), intstr.FromString("0%"), intstr.FromString("101%"),
		intstr.FromString("half"), {Type: 7}} {
		p := DriverUpgradePolicy{MaxUnavailable: &u}
		if errs := p.Validate(nil); len(errs) != 1 || errs[0].Field != "maxUnavailable" {
			t.Errorf("maxUnavailable %v: %v", u, errs)
		}
	}
	for _, u := range []intstr.IntOrString{intstr.FromInt32(1), intstr.FromString("1%"), intstr.FromString("25%"), intstr.FromString("100%")} {
		p := DriverUpgradePolicy{MaxUnavailable: &u}
		if errs := p.Validate(nil); len(errs) != 0 {
			t.Errorf("maxUnavailable %v: %v", u, errs)
		}
	}
}

// The CRD's podSelector rules are LabelSelectorPattern itself, and its
// driver version rule DriverVersionPattern (make manifests regenerates the
// CRD from the markers; this keeps the markers and the constants one).
// usePrecompiled takes the branch from a plain version: one with an OS
// suffix is rejected.
// A validator disabled while an operand waits for its toolkit-ready
// marker (a policy stored before the CRD's rule) names the field and the
// operands; with them off it is fine.
func TestValidateValidatorOff(t *testing.T) {
	off := ptr.To(false)
	spec := ClusterPolicySpec{Validator: OperandSpec{Enabled: off}}
	errs := spec.Validate()
	if len(errs) != 1 || errs[0].Field != "spec.validator.enabled" || !strings.Contains(errs[0].Detail, "device-plugin, dcgm-exporter, mig-manager would wait") {
		t.Errorf("validator off: %v", errs)
	}
	spec.DevicePlugin.Enabled, spec.DCGMExporter.Enabled, spec.MIGManager.Enabled = off, off, off
	if errs := spec.Validate(); len(errs) != 0 {
		t.Errorf("validator off, nothing waiting for it: %v", errs)
	}
}

func TestValidatePrecompiled(t *testing.T) {
	spec := ClusterPolicySpec{Driver: DriverSpec{UsePrecompiled: true}}
	spec.Driver.Image.Version = "570.172.08-ubuntu22.04"
	if errs := spec.Validate(); len(errs) != 1 || errs[0].Field != "spec.driver.usePrecompiled" {
		t.Errorf("precompiled with a suffixed version: %v", errs)
	}
	spec.Driver.Image.Version = "570.172.08"
	if errs := spec.Validate(); len(errs) != 0 {
		t.Errorf("precompiled 570.172.08: %v", errs)
	}
}

func TestCRDRulesUseThePatterns(t *testing.T) {
	b, err := os.ReadFile("../../../charts/loom/crds/gpu.loom.dev_clusterpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	rules := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if r, ok := v["rule"].(string); ok {
				rules[r] = true
			}
			if p, ok := v["pattern"].(string); ok {
				rules["pattern "+p] = true
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(crd)
	cel := func(pattern string) string { return strings.ReplaceAll(pattern, `\`, `\\`) }
	for _, want := range []string{
		"self.matches('" + cel(LabelSelectorPattern) + "')",
		"!has(self.image) || !has(self.image.version) || self.image.version.matches('" + cel(DriverVersionPattern) + "')",
		"pattern " + ImageRepositoryPattern, "pattern " + ImageNamePattern,
	} {
		if !rules[want] {
			t.Errorf("the CRD has no rule\n  %s", want)
		}
	}
}
