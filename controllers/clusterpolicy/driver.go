package clusterpolicy

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
)

// The driver image is built per OS, as GPU Operator's:
// <version>-<os id><os version> (570.172.08-ubuntu22.04), or precompiled
// for one kernel: <branch>-<kernel>-<os> (570-5.15.0-105-generic-ubuntu22.04).
// A node's OS comes from node feature discovery's os_release labels, else
// from its status.nodeInfo.osImage. One driver DaemonSet per OS (and
// kernel) among the GPU nodes, loom-driver-<target>, restricted to its
// nodes: by the NFD labels for nodes that have them, by node name for the
// others. A version that names its OS (570.172.08-ubuntu22.04) is used as
// is, by the one DaemonSet loom-driver on every GPU node.

// supportedOS are the OS ids NVIDIA publishes driver images for.
var supportedOS = []string{"ubuntu", "rhel", "rhcos", "sles"}

// maxNamed caps the node names a component message lists.
const maxNamed = 5

var (
	osImageRE = []struct {
		re *regexp.Regexp
		id string
	}{
		{regexp.MustCompile(`^Red Hat Enterprise Linux CoreOS ([0-9][0-9.]*)`), "rhcos"},
		{regexp.MustCompile(`^Red Hat Enterprise Linux (?:Server )?([0-9]+\.[0-9]+)`), "rhel"},
		{regexp.MustCompile(`^Ubuntu ([0-9]+\.[0-9]+)`), "ubuntu"},
		{regexp.MustCompile(`^SUSE Linux Enterprise Server ([0-9]+)(?: SP([0-9]+))?`), "sles"},
	}
	majorMinorRE = regexp.MustCompile(`^([0-9]+)\.([0-9]+)`)
	// rhcosBuildRE is RHCOS's own numbering (416.94.202405291527-0): 416 is
	// OpenShift 4.16.
	rhcosBuildRE = regexp.MustCompile(`^4([0-9]{2})\.`)
	nameUnsafeRE = regexp.MustCompile(`[^a-z0-9.-]+`)
)

// nodeOS is a GPU node's OS as the driver image names it (ubuntu22.04),
// whether NFD's labels said so, and why it has none.
type nodeOS struct {
	name, os, kernel string
	nfd              bool
	why              string
}

// osOf reads the node's OS: NFD's labels first, else its osImage.
func osOf(n *corev1.Node) nodeOS {
	out := nodeOS{name: n.Name, kernel: n.Status.NodeInfo.KernelVersion}
	id, version := n.Labels[gpuv1alpha1.LabelOSReleaseID], n.Labels[gpuv1alpha1.LabelOSReleaseVersionID]
	if id != "" && version != "" {
		out.nfd = true
		id = strings.ToLower(id)
	} else {
		id, version = parseOSImage(n.Status.NodeInfo.OSImage)
	}
	switch {
	case id == "":
		out.why = "OS unknown"
		if img := n.Status.NodeInfo.OSImage; img != "" {
			out.why = fmt.Sprintf("OS %q not recognised", img)
		}
	case !slices.Contains(supportedOS, id):
		out.why = fmt.Sprintf("OS %s not supported", id)
	default:
		if v := osVersion(id, version); v != "" {
			out.os = id + v
		} else {
			out.why = fmt.Sprintf("%s version %q not understood", id, version)
		}
	}
	return out
}

// parseOSImage reads an os id and version from status.nodeInfo.osImage:
// "Ubuntu 22.04.4 LTS", "Red Hat Enterprise Linux 9.4 (Plow)", "Red Hat
// Enterprise Linux CoreOS 416.94.202405291527-0 (Plow)", "SUSE Linux
// Enterprise Server 15 SP6".
func parseOSImage(img string) (id, version string) {
	for _, p := range osImageRE {
		m := p.re.FindStringSubmatch(img)
		if m == nil {
			continue
		}
		if p.id == "sles" {
			if m[2] == "" {
				return p.id, m[1]
			}
			return p.id, m[1] + "." + m[2]
		}
		return p.id, m[1]
	}
	return "", ""
}

// osVersion is the version as driver image tags write it: major.minor
// (22.04, 9.4, 15.6), and for RHCOS its OpenShift release (4.16).
func osVersion(id, version string) string {
	if id == "rhcos" {
		if m := rhcosBuildRE.FindStringSubmatch(version); m != nil {
			return "4." + strings.TrimPrefix(m[1], "0")
		}
		if m := majorMinorRE.FindStringSubmatch(version); m != nil && m[1] == "4" {
			return m[0]
		}
		return "" // RHCOS 9.6.x and later no longer name the OpenShift release
	}
	if m := majorMinorRE.FindStringSubmatch(version); m != nil {
		return m[0]
	}
	return ""
}

// driverGroup is one driver DaemonSet: its target, image tag and nodes.
type driverGroup struct {
	target, tag string
	// nfdIDs and nfdVersions are the raw NFD label values of the nodes
	// the group matches by label; names the nodes it matches by name.
	nfdIDs, nfdVersions, names []string
}

// driverGroups splits the GPU nodes by OS (and kernel, for precompiled
// drivers) and names those that get no driver, with why. A version with an
// OS suffix is one group for every node.
func driverGroups(cp *gpuv1alpha1.ClusterPolicy, nodes []corev1.Node) (groups []driverGroup, noDriver []string) {
	img, _ := cp.Spec.Driver.EffectiveImage(defaultsFor(gpuv1alpha1.OperandDriver))
	if strings.Contains(img.Version, "-") {
		return []driverGroup{{tag: img.Version}}, nil
	}
	branch, _, _ := strings.Cut(img.Version, ".")
	byTarget := map[string]*driverGroup{}
	for i := range nodes {
		if !meantFor(&nodes[i], cp, gpuv1alpha1.OperandDriver) {
			// Opted out of Loom's driver (one installed on the host, say),
			// or outside the driver's node selector: it wants none, so its
			// OS is no reason to name it.
			continue
		}
		o := osOf(&nodes[i])
		if o.why == "" && cp.Spec.Driver.UsePrecompiled && o.kernel == "" {
			o.why = "kernel version unknown"
		}
		if o.why != "" {
			noDriver = append(noDriver, o.name+" ("+o.why+")")
			continue
		}
		target, tag := o.os, img.Version+"-"+o.os
		if cp.Spec.Driver.UsePrecompiled {
			target, tag = o.os+"-"+o.kernel, branch+"-"+o.kernel+"-"+o.os
		}
		target = dnsSafe(target)
		g := byTarget[target]
		if g == nil {
			g = &driverGroup{target: target, tag: tag}
			byTarget[target] = g
		}
		// Precompiled groups go by name: a kernel label lags an upgrade.
		if o.nfd && !cp.Spec.Driver.UsePrecompiled {
			l := nodes[i].Labels
			g.nfdIDs, g.nfdVersions = addSorted(g.nfdIDs, l[gpuv1alpha1.LabelOSReleaseID]), addSorted(g.nfdVersions, l[gpuv1alpha1.LabelOSReleaseVersionID])
		} else {
			g.names = addSorted(g.names, o.name)
		}
	}
	for _, t := range sortedKeys(byTarget) {
		groups = append(groups, *byTarget[t])
	}
	sort.Strings(noDriver)
	return groups, noDriver
}

// terms are the node terms of a group: NFD labels, node names.
func (g driverGroup) terms() []corev1.NodeSelectorTerm {
	var out []corev1.NodeSelectorTerm
	if len(g.nfdIDs) > 0 {
		out = append(out, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: gpuv1alpha1.LabelOSReleaseID, Operator: corev1.NodeSelectorOpIn, Values: g.nfdIDs},
			{Key: gpuv1alpha1.LabelOSReleaseVersionID, Operator: corev1.NodeSelectorOpIn, Values: g.nfdVersions}}})
	}
	// A field selector takes one value (the API rejects metadata.name In
	// with two): one term per node, terms are ORed.
	for _, name := range g.names {
		out = append(out, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{name}}}})
	}
	return out
}

// driverDaemonSets are the driver's DaemonSets, one per group.
func driverDaemonSets(cp *gpuv1alpha1.ClusterPolicy, namespace string, groups []driverGroup) []*appsv1.DaemonSet {
	op := operandByName(gpuv1alpha1.OperandDriver)
	img, _ := cp.Spec.Driver.EffectiveImage(defaultsFor(gpuv1alpha1.OperandDriver))
	out := make([]*appsv1.DaemonSet, 0, len(groups))
	for _, g := range groups {
		if g.target == "" {
			out = append(out, buildDaemonSet(op, cp, namespace, variant{image: img.Repository + "/" + img.Image + ":" + g.tag}))
			continue
		}
		out = append(out, buildDaemonSet(op, cp, namespace, variant{target: g.target,
			image: img.Repository + "/" + img.Image + ":" + g.tag, restrict: g.terms()}))
	}
	return out
}

// dnsSafe makes a target fit a DaemonSet name (after loom-driver-) and a
// label value: lower case letters, digits, '.' and '-', at most 50
// characters (a hash ends a longer one).
func dnsSafe(s string) string {
	s = strings.Trim(nameUnsafeRE.ReplaceAllString(strings.ToLower(s), "-"), "-.")
	const most = 50
	if len(s) > most {
		s = strings.Trim(s[:most-9], "-.") + "-" + apply.Hash(s)[:8]
	}
	return s
}

// namedList names at most maxNamed items and counts the rest.
func namedList(items []string) string {
	if len(items) > maxNamed {
		return strings.Join(items[:maxNamed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxNamed)
	}
	return strings.Join(items, ", ")
}

func addSorted(s []string, v string) []string {
	i, found := slices.BinarySearch(s, v)
	if found {
		return s
	}
	return slices.Insert(s, i, v)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func operandByName(name string) operand {
	for _, op := range operands {
		if op.name == name {
			return op
		}
	}
	panic("no operand " + name)
}
