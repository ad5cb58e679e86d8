// Package driveros reads a GPU node's OS as NVIDIA's driver images name it
// (<id><version>: ubuntu22.04, rhel9.4, rhcos4.16, sles15.6), from node
// feature discovery's os_release labels, else (or where it names another
// OS with a driver image: NFD lags an OS upgrade) from the node's osImage: the
// ClusterPolicy runs one driver DaemonSet per OS, and the driver upgrade
// tells a node whose OS's DaemonSet is being made from one that has none.
package driveros

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// Supported are the OS ids NVIDIA publishes driver images for.
var Supported = []string{"ubuntu", "rhel", "rhcos", "sles"}

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
	// kernelRE is a kernel version a precompiled driver's image tag can
	// hold: <branch>-<kernel>-<os> is at most 128 characters of these.
	kernelRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,` + fmt.Sprint(maxKernel) + `}$`)
)

// maxKernel leaves a tag's 128 characters room for a branch and an OS.
const maxKernel = 100

// OS is a GPU node's OS as the driver image names it (ubuntu22.04), its
// kernel, whether NFD's labels said so, and why it has no driver image
// ("": it has one).
type OS struct {
	OS, Kernel string
	NFD        bool
	Why        string
}

// Of reads the node's OS: NFD's labels first, else its osImage. Where
// both name an OS with a driver image and they differ, the osImage wins:
// the kubelet reports the running OS at every status update, NFD only at
// its next pass, so after an OS upgrade the labels name the old OS for a
// while, and the old OS's driver would not build or load. A precompiled
// driver also needs the node's kernel version.
func Of(n *corev1.Node, precompiled bool) OS {
	out := OS{Kernel: n.Status.NodeInfo.KernelVersion}
	img := n.Status.NodeInfo.OSImage
	id, version := n.Labels[gpuv1alpha1.LabelOSReleaseID], n.Labels[gpuv1alpha1.LabelOSReleaseVersionID]
	if id != "" && version != "" {
		out.NFD = true
		out.OS, out.Why = name(strings.ToLower(id), version, img)
		kid, kversion := parseOSImage(img)
		if kubelet, why := name(kid, kversion, img); why == "" && kubelet != out.OS {
			out.OS, out.Why, out.NFD = kubelet, "", false
		}
	} else {
		id, version = parseOSImage(img)
		out.OS, out.Why = name(id, version, img)
	}
	switch {
	case out.Why != "" || !precompiled:
	case out.Kernel == "":
		out.Why = "kernel version unknown"
	case !kernelRE.MatchString(out.Kernel):
		out.Why = fmt.Sprintf("kernel %.80q makes no image tag (<branch>-<kernel>-<os>): letters, digits, '_', '.' and '-', at most %d characters", out.Kernel, maxKernel)
	}
	return out
}

// name is the OS as driver images name it (ubuntu22.04), or why there is
// none; img is the node's osImage, quoted when it was not recognised.
func name(id, version, img string) (os, why string) {
	switch {
	case id == "" && img != "":
		return "", fmt.Sprintf("OS %q not recognised", img)
	case id == "":
		return "", "OS unknown"
	case !slices.Contains(Supported, id):
		return "", fmt.Sprintf("OS %s not supported", id)
	}
	if v := osVersion(id, version); v != "" {
		return id + v, ""
	}
	return "", fmt.Sprintf("%s version %q not understood", id, version)
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
