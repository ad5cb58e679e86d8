package v1alpha1

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The validation of a ClusterPolicy has two halves. The CRD's schema and
// CEL rules (the markers on the types) reject at apply what the object alone
// decides. Validate repeats those checks in Go and adds what CEL cannot
// afford (label keys of maps, the length limits of a selector's keys): the
// ClusterPolicy reconciler reports its findings as Ready=False, reason
// InvalidSpec, and the driver upgrade starts no node while any stand. It
// also judges objects stored before a rule existed.

// LabelSelectorPattern is the grammar of a label selector string
// (k8s.io/apimachinery/pkg/labels.Parse: "app=training,tier in (gpu,cpu),
// !canary"): requirements separated by commas, each "[!]key", "key=value",
// "key==value", "key!=value", "key in (v1,v2)", "key notin (v1,v2)", or
// "key>n" and "key<n" for integers, with label keys and values of the
// allowed characters and lengths. The podSelector CEL rules use it
// verbatim; a DNS prefix longer than 253 characters and an integer beyond
// int64 are left to Validate.
const LabelSelectorPattern = `^` + ws + `(` + selectorRequirement + `(` + ws + `,` + ws + selectorRequirement + `)*)?` + ws + `$`

const (
	ws                  = `[ \t\r\n]*`
	labelName           = `[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?`
	labelKey            = `([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?` + labelName
	labelValue          = `(` + labelName + `)?`
	selectorRequirement = `(!` + ws + labelKey + `|` + labelKey + `(` +
		ws + `(==|=|!=)` + ws + labelValue + `|` +
		ws + `[<>]` + ws + `[0-9]{1,63}` + `|` +
		`[ \t\r\n]+(in|notin)` + ws + `[(]` + ws + labelValue + ws + `(,` + ws + labelValue + ws + `)*[)]` +
		`)?)`
)

// DriverVersionPattern is what driver.image.version must be: an NVIDIA
// driver version, digits and dots (570.172.08, 550.54.15), optionally
// followed by a suffix starting with a dash (570.172.08-ubuntu22.04,
// 550.54.15-rhel9.4): the driver images' tags. Tags such as latest, and
// precompiled-driver tags (570-5.15.0-1040-azure-ubuntu22.04), are not.
const DriverVersionPattern = `^[0-9]+([.][0-9]+)+(-[A-Za-z0-9][A-Za-z0-9_.-]*)?$`

// ImageRepositoryPattern is what an image's repository must be: a registry
// host of DNS labels with an optional port, then path components of lower
// case letters and digits joined by '.', '_', '__' or dashes, as the
// image reference grammar (distribution/reference) has them:
// nvcr.io/nvidia, registry.example:5000/team. ImageNamePattern is the
// image's name within it: path components alone. A reference outside the
// grammar is one the kubelet refuses to pull (InvalidImageName) on every
// node.
const (
	ImageRepositoryPattern = `^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?([.][A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:[0-9]{1,5})?` + imagePath + `$`
	ImageNamePattern       = `^` + imageComponent + imagePath + `$`
	imageComponent         = `[a-z0-9]+(([.]|_|__|-+)[a-z0-9]+)*`
	imagePath              = `(/` + imageComponent + `)*`
)

// KernelModuleTypes are the values of driver.kernelModuleType.
var KernelModuleTypes = []string{"auto", "open", "proprietary"}

// MaxSelectorLength bounds a pod selector string (and so the cost of its
// CEL rule).
const MaxSelectorLength = 1024

// The patterns compile on first use: the selector grammar alone is about
// 600 KB of compiled program, and a manager that never validates a
// ClusterPolicy (a Ray-only one) should not carry it.
var (
	labelSelectorRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(LabelSelectorPattern) })
	driverVersionRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(DriverVersionPattern) })
	repositoryRE    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(ImageRepositoryPattern) })
	imageNameRE     = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(ImageNamePattern) })
	percentRE       = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(100|[1-9][0-9]?)%$`) })
)

// ParseSelector parses a label selector as the policy's pod selectors are
// read: the grammar of LabelSelectorPattern, then labels.Parse. The error
// says what is wrong.
func ParseSelector(s string) (labels.Selector, error) {
	if len(s) > MaxSelectorLength {
		return nil, fmt.Errorf("longer than %d characters", MaxSelectorLength)
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, err
	}
	if !labelSelectorRE().MatchString(s) {
		// labels.Parse ends its input at a NUL byte; the API server's rule
		// does not.
		return nil, fmt.Errorf("not a label selector (e.g. app=training,tier in (gpu))")
	}
	return sel, nil
}

// Validate returns everything wrong with the spec, each error naming its
// field from spec (e.g. spec.driver.upgradePolicy.drain.podSelector).
func (s *ClusterPolicySpec) Validate() field.ErrorList {
	spec := field.NewPath("spec")
	errs := s.Driver.UpgradePolicy.Validate(spec.Child("driver", "upgradePolicy"))
	if v := s.Driver.Image.Version; v != "" && !driverVersionRE().MatchString(v) {
		errs = append(errs, field.Invalid(spec.Child("driver", "image", "version"), v,
			"must be a driver version such as 570.172.08 or 550.54.15, optionally with a suffix such as -ubuntu22.04"))
	}
	if v := s.Driver.Image.Version; s.Driver.UsePrecompiled && strings.Contains(v, "-") {
		errs = append(errs, field.Invalid(spec.Child("driver", "usePrecompiled"), true,
			"takes the branch from image.version and the OS and kernel from each node: give a version without a suffix, e.g. 570.172.08"))
	}
	if k := s.Driver.KernelModuleType; k != "" && !slices.Contains(KernelModuleTypes, k) {
		errs = append(errs, field.NotSupported(spec.Child("driver", "kernelModuleType"), k, KernelModuleTypes))
	}
	if pc := s.DaemonSets.PriorityClassName; pc != "" {
		for _, msg := range validation.IsDNS1123Subdomain(pc) {
			errs = append(errs, field.Invalid(spec.Child("daemonsets", "priorityClassName"), pc, msg))
		}
	}
	errs = append(errs, validateLabels(s.DaemonSets.Labels, spec.Child("daemonsets", "labels"))...)
	for _, k := range slices.Sorted(maps.Keys(s.DaemonSets.Annotations)) {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(spec.Child("daemonsets", "annotations").Key(k), k, msg))
		}
	}
	errs = append(errs, s.validateValidator(spec)...)
	for _, op := range s.operandFields() {
		errs = append(errs, validateLabels(op.spec.NodeSelector, spec.Child(op.field, "nodeSelector"))...)
		img := spec.Child(op.field, "image")
		if r := op.spec.Image.Repository; r != "" && (len(r) > 255 || !repositoryRE().MatchString(r)) {
			errs = append(errs, field.Invalid(img.Child("repository"), r, "must be a registry host and path such as nvcr.io/nvidia (lower-case path components)"))
		}
		if n := op.spec.Image.Image; n != "" && (len(n) > 255 || !imageNameRE().MatchString(n)) {
			errs = append(errs, field.Invalid(img.Child("image"), n, "must be an image name such as driver (lower-case path components)"))
		}
	}
	return errs
}

// validateValidator refuses a validator disabled while an operand that
// waits for its toolkit-ready marker (AfterToolkit) runs: it would wait for
// ever on every node.
func (s *ClusterPolicySpec) validateValidator(spec *field.Path) field.ErrorList {
	if s.OperandEnabled(OperandValidator) {
		return nil
	}
	var waiting []string
	for _, op := range AfterToolkit {
		if s.OperandEnabled(op) {
			waiting = append(waiting, op)
		}
	}
	if len(waiting) == 0 {
		return nil
	}
	return field.ErrorList{field.Invalid(spec.Child("validator", "enabled"), false, fmt.Sprintf(
		"%s would wait for ever on every node for the toolkit-ready marker only the validator writes: keep the validator, or disable those too",
		strings.Join(waiting, ", ")))}
}

// operandFields are the operands' specs by their field names in the spec.
func (s *ClusterPolicySpec) operandFields() []struct {
	field string
	spec  *OperandSpec
} {
	return []struct {
		field string
		spec  *OperandSpec
	}{
		{"driver", &s.Driver.OperandSpec}, {"toolkit", &s.Toolkit}, {"validator", &s.Validator},
		{"devicePlugin", &s.DevicePlugin.OperandSpec}, {"dcgm", &s.DCGM}, {"dcgmExporter", &s.DCGMExporter.OperandSpec},
		{"migManager", &s.MIGManager.OperandSpec}, {"nodeStatusExporter", &s.NodeStatusExporter},
	}
}

// Validate returns what is wrong with the upgrade policy, each error naming
// its field below path (nil: from the policy itself, e.g. drain.podSelector).
func (p *DriverUpgradePolicy) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if n := p.MaxParallelUpgrades; n != nil && *n < 0 {
		errs = append(errs, field.Invalid(path.Child("maxParallelUpgrades"), *n, "must be 0 (unlimited) or more"))
	}
	if u := p.MaxUnavailable; u != nil {
		if msg := maxUnavailableError(*u); msg != "" {
			errs = append(errs, field.Invalid(path.Child("maxUnavailable"), u.String(), msg))
		}
	}
	if w := p.WaitForCompletion; w != nil {
		errs = append(errs, validateSelector(w.PodSelector, path.Child("waitForCompletion", "podSelector"))...)
		errs = append(errs, validateTimeout(w.TimeoutSeconds, path.Child("waitForCompletion", "timeoutSeconds"))...)
	}
	if d := p.PodDeletion; d != nil {
		errs = append(errs, validateTimeout(d.TimeoutSeconds, path.Child("podDeletion", "timeoutSeconds"))...)
	}
	if d := p.Drain; d != nil {
		errs = append(errs, validateSelector(d.PodSelector, path.Child("drain", "podSelector"))...)
		errs = append(errs, validateTimeout(d.TimeoutSeconds, path.Child("drain", "timeoutSeconds"))...)
	}
	return errs
}

// maxUnavailableError says what is wrong with a maxUnavailable ("" when
// nothing): a count of at least 1 or a percentage from 1% to 100%.
func maxUnavailableError(u intstr.IntOrString) string {
	const why = "must be at least 1 or from 1% to 100%: 0 would never upgrade a node (set autoUpgrade: false to pause upgrades)"
	switch u.Type {
	case intstr.Int:
		if u.IntVal < 1 {
			return why
		}
	case intstr.String:
		if !percentRE().MatchString(u.StrVal) {
			return why
		}
	default:
		return why
	}
	return ""
}

func validateSelector(s string, path *field.Path) field.ErrorList {
	if s == "" {
		return nil
	}
	if _, err := ParseSelector(s); err != nil {
		return field.ErrorList{field.Invalid(path, s, err.Error())}
	}
	return nil
}

func validateTimeout(seconds int32, path *field.Path) field.ErrorList {
	if seconds < 0 {
		return field.ErrorList{field.Invalid(path, seconds, "must be 0 or more")}
	}
	return nil
}

// validateLabels checks a map of label keys and values (a node selector,
// pod labels), in key order so that the errors read the same every pass.
func validateLabels(m map[string]string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(path.Key(k), k, "key: "+msg))
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(path.Key(k), v, msg))
		}
	}
	return errs
}
