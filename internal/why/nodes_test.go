package why

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

var now = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// smallSource is a ClusterPolicy whose device plugin config time-slices
// each GPU into 4 advertised as nvidia.com/small; smallNames its GPU
// resources.
var (
	smallSource = sharing.Source{Policy: &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "dp", DefaultConfig: "small"}, Namespace: "loom",
		Data: map[string]string{"small": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      rename: nvidia.com/small\n      replicas: 4\n"}}
	smallNames = sharing.NamesOf(smallSource)
)

// nics are the resources the NVIDIA network operator's device plugins
// advertise under nvidia.com/: not GPUs.
func nics(n int64) corev1.ResourceList {
	q := *resource.NewQuantity(n, resource.DecimalSI)
	return corev1.ResourceList{"nvidia.com/rdma_shared": q, "nvidia.com/mlnxnics": q}
}

// plus is a and b together.
func plus(a, b corev1.ResourceList) corev1.ResourceList {
	out := a.DeepCopy()
	for k, v := range b {
		out[k] = v
	}
	return out
}

func gpuNode(name string, labels, annotations map[string]string, alloc corev1.ResourceList) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations}}
	n.Status.Allocatable = alloc
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	return n
}

func gpus(n int64) corev1.ResourceList {
	return corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(n, resource.DecimalSI), corev1.ResourceCPU: resource.MustParse("64")}
}

func inventory(name string, nvml *metav1.Condition, unhealthy ...gpuv1alpha1.GPUHealth) *gpuv1alpha1.GPUNode {
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	gn.Status.GPUCount, gn.Status.Product, gn.Status.DriverVersion = 8, "NVIDIA H100 80GB HBM3", "570.172.08"
	gn.Status.Conditions = []metav1.Condition{c(gpuv1alpha1.ConditionReady, "True", gpuv1alpha1.ReasonCollected, "ok")}
	if nvml != nil {
		gn.Status.Conditions = append(gn.Status.Conditions, *nvml)
	}
	for i := range 8 {
		g := gpuv1alpha1.GPU{Index: int32(i), UUID: "GPU-" + string(rune('a'+i)), Health: gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUHealthy}}
		if i < len(unhealthy) {
			g.Health = unhealthy[i]
		}
		gn.Status.GPUs = append(gn.Status.GPUs, g)
	}
	return gn
}

func TestNode(t *testing.T) {
	present := map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range present {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	nvmlDown := c(gpuv1alpha1.ConditionNVMLUnavailable, "True", gpuv1alpha1.ReasonNVMLLost, "NVML: driver not loaded")
	unprivileged := c(gpuv1alpha1.ConditionNVMLUnavailable, "True", gpuv1alpha1.ReasonUnprivileged, "ERROR_DRIVER_NOT_LOADED")
	cases := []struct {
		name   string
		node   corev1.Node
		cordon bool
		gn     *gpuv1alpha1.GPUNode
		line   string
		advice string
	}{
		{"healthy", gpuNode("g1", present, nil, gpus(8)), false, inventory("g1", nil),
			"node/g1: Ready: NVIDIA-H100-80GB-HBM3: 8 nvidia.com/gpu allocatable; schedulable, no GPU problem known", ""},
		{"upgrade failed", gpuNode("g1", with(map[string]string{gpuv1alpha1.LabelUpgradeState: gpuv1alpha1.UpgradeFailed}),
			map[string]string{gpuv1alpha1.AnnotationClaim: "default", gpuv1alpha1.AnnotationFailure: "driver pod not ready after 10m"}, gpus(8)), true, inventory("g1", nil),
			"node/g1: UpgradeFailed (UpgradeFailed): driver upgrade failed: driver pod not ready after 10m", "gpu.loom.dev/driver-upgrade-resume=true"},
		{"unclaimed state", gpuNode("g1", with(map[string]string{gpuv1alpha1.LabelUpgradeState: gpuv1alpha1.DrainRequired}), nil, gpus(8)), false, nil,
			"node/g1: UpgradeIgnored (NotClaimed): nvidia.com/gpu-driver-upgrade-state=drain-required was not set by Loom (no gpu.loom.dev/driver-upgrade-claim annotation): Loom leaves the node alone",
			"kubectl label node g1 nvidia.com/gpu-driver-upgrade-state-"},
		{"cordoned", gpuNode("g1", present, nil, gpus(8)), true, nil,
			"node/g1: Cordoned (Unschedulable): the node is cordoned (not by a Loom driver upgrade)", "kubectl uncordon g1"},
		{"nvml", gpuNode("g1", present, nil, gpus(8)), false, inventory("g1", &nvmlDown),
			"node/g1: NVMLUnavailable (NVMLLost): GPUNode: NVML: driver not loaded", "check the driver pod on the node: kubectl get pods -A -l app.kubernetes.io/component=driver --field-selector spec.nodeName=g1"},
		{"agent unprivileged", gpuNode("g1", present, nil, gpus(8)), false, inventory("g1", &unprivileged),
			"node/g1: NVMLUnavailable (Unprivileged): GPUNode: the node agent runs unprivileged: NVML: ERROR_DRIVER_NOT_LOADED", "nodeAgent.privileged=true"},
		{"no device plugin", gpuNode("g1", present, nil, corev1.ResourceList{}), false, nil,
			"node/g1: NoGPUResources (DevicePluginNotReady): the node advertises no GPU resource: the device plugin has not registered its GPUs", "component=device-plugin"},
		{"NICs only", gpuNode("g1", present, nil, nics(4)), false, nil,
			"node/g1: NoGPUResources (DevicePluginNotReady): the node advertises no GPU resource: the device plugin has not registered its GPUs", "component=device-plugin"},
		{"renamed shared GPUs beside NICs", gpuNode("g1", present, nil, plus(nics(4), corev1.ResourceList{"nvidia.com/small": resource.MustParse("32")})), false, inventory("g1", nil),
			"node/g1: Ready: NVIDIA-H100-80GB-HBM3: 32 nvidia.com/small allocatable; schedulable, no GPU problem known", ""},
		{"not a GPU node", gpuNode("c1", nil, nil, corev1.ResourceList{}), false, nil,
			"node/c1: NoGPUs (NotAGPUNode): the node is not labelled nvidia.com/gpu.present=true, has no GPUNode and advertises no GPU resource", "node feature discovery"},
		{"unlabelled, GPUs advertised", gpuNode("u1", nil, nil, gpus(8)), false, nil,
			"node/u1: Ready: 8 nvidia.com/gpu allocatable; schedulable, no GPU problem known", ""},
		{"NICs only, unlabelled", gpuNode("c1", nil, nil, nics(2)), false, nil,
			"node/c1: NoGPUs (NotAGPUNode): the node is not labelled nvidia.com/gpu.present=true, has no GPUNode and advertises no GPU resource", "node feature discovery"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.node.Spec.Unschedulable = tc.cordon
			a := Node(&tc.node, tc.gn, smallNames)
			if a.Line() != tc.line {
				t.Errorf("line\n got %q\nwant %q", a.Line(), tc.line)
			}
			if !strings.Contains(a.Advice, tc.advice) || (tc.advice == "" && a.Advice != "") {
				t.Errorf("advice %q, want it to hold %q", a.Advice, tc.advice)
			}
		})
	}
}

func TestGPUNode(t *testing.T) {
	xid := gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthXidCriticalError, Message: "Xid 79: GPU has fallen off the bus"}
	a := GPUNode(inventory("g1", nil, xid))
	if want := "gpunode/g1: Unhealthy (UnhealthyGPUs): GPU 0 (GPU-a) XidCriticalError: Xid 79: GPU has fallen off the bus"; a.Line() != want {
		t.Errorf("got %q, want %q", a.Line(), want)
	}
	if !strings.Contains(a.Advice, "kubectl annotate gpunode g1 gpu.loom.dev/reset-gpu-health=all") {
		t.Errorf("advice %q", a.Advice)
	}
	remap := gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthRowRemapFailure}
	if a := GPUNode(inventory("g1", nil, remap)); !strings.Contains(a.Advice, "needs replacing") {
		t.Errorf("row remap failure advice %q", a.Advice)
	}
	if a := GPUNode(inventory("g1", nil)); a.Line() != "gpunode/g1: Ready: 8 × NVIDIA H100 80GB HBM3, driver 570.172.08, all healthy" {
		t.Errorf("healthy: %q", a.Line())
	}
	cut := inventory("g1", nil)
	cut.Status.Conditions = append(cut.Status.Conditions, metav1.Condition{Type: gpuv1alpha1.ConditionTruncated, Status: metav1.ConditionTrue,
		Reason: gpuv1alpha1.ReasonTooManyMIGDevices, Message: "56 MIG devices reported, 32 kept"})
	if a := GPUNode(cut); !strings.HasSuffix(a.Line(), "all healthy; the status is cut (TooManyMIGDevices): 56 MIG devices reported, 32 kept") ||
		!strings.Contains(a.Advice, "nvidia-smi") {
		t.Errorf("truncated: %q, advice %q", a.Line(), a.Advice)
	}
	if a := GPUNode(&gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "g2"}}); a.Reason != "NoStatus" || !strings.Contains(a.Advice, "component=node-agent") {
		t.Errorf("no status: %+v", a)
	}
}

func pod(ns, name, node string, phase corev1.PodPhase, res corev1.ResourceName, n int64) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	p.Spec.NodeName, p.Status.Phase = node, phase
	q := *resource.NewQuantity(n, resource.DecimalSI)
	p.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{res: q}, Limits: corev1.ResourceList{res: q}}}}
	return p
}

func TestFleet(t *testing.T) {
	mig := gpuNode("a100", map[string]string{gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB", gpuv1alpha1.LabelMIGConfig: "all-1g.5gb", gpuv1alpha1.LabelMIGConfigState: "success"}, nil,
		corev1.ResourceList{"nvidia.com/mig-1g.5gb": resource.MustParse("56")})
	h100 := gpuNode("h100", map[string]string{gpuv1alpha1.LabelPresent: "true"}, nil, gpus(8))
	h100.Spec.Unschedulable = true
	cpu := gpuNode("cpu", nil, nil, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")})
	nic := gpuNode("nic", nil, nil, nics(2))
	l40 := gpuNode("l40", nil, nil, plus(nics(2), corev1.ResourceList{"nvidia.com/small": resource.MustParse("16")}))
	pods := []corev1.Pod{
		pod("ml", "s", "l40", corev1.PodRunning, "nvidia.com/small", 3),
		pod("ml", "r", "l40", corev1.PodRunning, "nvidia.com/rdma_shared", 1),
		pod("ml", "a", "h100", corev1.PodRunning, "nvidia.com/gpu", 4),
		pod("ml", "b", "h100", corev1.PodPending, "nvidia.com/gpu", 2),
		pod("ml", "done", "h100", corev1.PodSucceeded, "nvidia.com/gpu", 2),
		pod("ml", "m", "a100", corev1.PodRunning, "nvidia.com/mig-1g.5gb", 3),
		pod("ml", "unbound", "", corev1.PodPending, "nvidia.com/gpu", 8),
	}
	xid := gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthXidCriticalError}
	fleet := Fleet([]corev1.Node{mig, h100, cpu, nic, l40}, []gpuv1alpha1.GPUNode{*inventory("h100", nil, xid)}, pods, smallNames)
	var b bytes.Buffer
	if err := WriteFleet(&b, fleet, true); err != nil {
		t.Fatal(err)
	}
	want := `NODE   PRODUCT                 GPUS   UNHEALTHY   RESOURCE                ALLOCATABLE   ALLOCATED   FREE   MIG                    SCHEDULABLE   PODS
a100   NVIDIA-A100-SXM4-40GB   0      0           nvidia.com/mig-1g.5gb   56            3           53     all-1g.5gb (success)   true          ml/m=3
h100   NVIDIA H100 80GB HBM3   8      1           nvidia.com/gpu          8             6           2      -                      false         ml/a=4,ml/b=2
l40    -                       0      0           nvidia.com/small        16            3           13     -                      true          ml/s=3
`
	if b.String() != want {
		t.Errorf("fleet table\n got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestUpgrades(t *testing.T) {
	claimed := func(extra map[string]string) map[string]string {
		m := map[string]string{gpuv1alpha1.AnnotationClaim: "default", gpuv1alpha1.AnnotationPhaseStarted: now.Add(-5 * time.Minute).Format(time.RFC3339)}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	st := func(s string) map[string]string {
		return map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelUpgradeState: s}
	}
	nodes := []corev1.Node{
		gpuNode("d", st(gpuv1alpha1.UpgradeDone), claimed(nil), gpus(8)),
		gpuNode("c", st(gpuv1alpha1.DrainRequired), claimed(map[string]string{gpuv1alpha1.AnnotationBlocked: "evicting ml/a: admission webhook denied"}), gpus(8)),
		gpuNode("b", st(gpuv1alpha1.UpgradeFailed), claimed(map[string]string{gpuv1alpha1.AnnotationFailure: "validation timed out"}), gpus(8)),
		gpuNode("a", st(gpuv1alpha1.PodRestartRequired), nil, gpus(8)),
		gpuNode("e", map[string]string{gpuv1alpha1.LabelPresent: "true"}, nil, gpus(8)),
		gpuNode("cpu", nil, nil, nil),
		gpuNode("nic", nil, nil, nics(2)),
	}
	nodes[1].Spec.Unschedulable, nodes[2].Spec.Unschedulable = true, true
	cp := gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	cp.Status.Conditions = []metav1.Condition{c(gpuv1alpha1.ConditionDriverUpgrade, "False", gpuv1alpha1.ReasonUpgradeInProgress, "1 of 5 nodes upgrading; failed: b")}
	ignored := gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
	ignored.Status.State = gpuv1alpha1.PolicyIgnored
	var b bytes.Buffer
	if err := WriteUpgrades(&b, Upgrades([]gpuv1alpha1.ClusterPolicy{cp, ignored}), UpgradeNodes(nodes, now, smallNames), false); err != nil {
		t.Fatal(err)
	}
	want := `clusterpolicy/default: DriverUpgrade=False UpgradeInProgress: 1 of 5 nodes upgrading; failed: b
NODE   STATE                  CLAIM     CORDONED   SINCE   DETAIL
b      upgrade-failed         default   true       5m      validation timed out
c      drain-required         default   true       5m      blocked: evicting ml/a: admission webhook denied
a      pod-restart-required   -         false      -       not claimed by Loom (no gpu.loom.dev/driver-upgrade-claim): ignored
d      upgrade-done           default   false      5m      -
e      -                      -         false      -       -
`
	if b.String() != want {
		t.Errorf("upgrades\n got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestWarnings(t *testing.T) {
	ev := func(typ, reason string, ago time.Duration, count int32) corev1.Event {
		return corev1.Event{Type: typ, Reason: reason, Message: "m\n" + reason, Count: count, LastTimestamp: metav1.NewTime(now.Add(-ago))}
	}
	events := []corev1.Event{ev("Warning", "Newest", time.Minute, 1), ev("Normal", "Fine", 0, 1), ev("Warning", "Oldest", time.Hour, 3), ev("Warning", "Middle", 10*time.Minute, 1)}
	got := Warnings(events, 2, now)
	want := []string{"10m ago Middle: m Middle", "60s ago Newest: m Newest"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := Warnings(events, 5, now); len(got) != 3 || got[0] != "60m ago Oldest (x3): m Oldest" {
		t.Errorf("all: %q", got)
	}
}

func TestWriteAnswer(t *testing.T) {
	var b bytes.Buffer
	a := Answer{Object: "trainingjob/x", State: "Pending", Reason: "NeverFits", Message: "too big", Advice: "shrink it", Also: []string{"one"}, Events: []string{"1m ago NeverFits: too big"}}
	if err := WriteAnswer(&b, a); err != nil {
		t.Fatal(err)
	}
	want := "trainingjob/x: Pending (NeverFits): too big\nWhat to do: shrink it\nAlso: one\nWarning events:\n  1m ago NeverFits: too big\n"
	if b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

// A node is ready only by a True Ready condition: one the kubelet has not
// posted yet reads NotReady as one the node lifecycle controller set
// Unknown does, not Ready.
func TestNodeNotReady(t *testing.T) {
	present := map[string]string{gpuv1alpha1.LabelPresent: "true"}
	unknown := gpuNode("g1", present, nil, gpus(8))
	unknown.Status.Conditions[0] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
		Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status."}
	none := gpuNode("g1", present, nil, gpus(8))
	none.Status.Conditions = nil
	for _, tc := range []struct {
		name string
		node corev1.Node
		line string
	}{
		{"kubelet silent", unknown, "node/g1: NotReady (NodeStatusUnknown): Kubelet stopped posting node status."},
		{"no Ready condition yet", none, "node/g1: NotReady (NoReadyCondition): the kubelet has not reported the node's Ready condition yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Node(&tc.node, inventory("g1", nil), smallNames).Line(); got != tc.line {
				t.Errorf("line:\n got %s\nwant %s", got, tc.line)
			}
		})
	}
}
