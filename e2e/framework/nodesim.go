package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// NodeSim plays, for the simulated nodes registered with it, what the GPU
// stack's containers would do on a real node. kwok marks every pod Running
// and Ready at once and runs nothing, so without it a node "has" a driver the
// moment a pod is scheduled. NodeSim reads the operand pods Loom rendered and
// acts out their containers, honouring exactly the init containers Loom gave
// them:
//
//   - an init container "wait-for-X" holds its pod until the node's marker
//     X-ready exists (GPU Operator's /run/nvidia/validations); one named
//     "C-validation" holds it until component C works on the node, and then
//     writes C-ready;
//   - a started driver pod loads the driver: the file the simulated NVML
//     looks for appears in the node's driver root (and goes while no driver
//     pod runs, as during an upgrade's pod restart);
//   - a started validator pod (its container's COMPONENT env) writes X-ready
//     once X works;
//   - a started device plugin advertises the node's GPUs as allocatable
//     resources under the MIG strategy and the sharing config it was given
//     (its MIG_STRATEGY env and mounted config);
//   - a started MIG manager applies the layout the node's
//     nvidia.com/mig.config label names from the config it mounts, through
//     the simulated NVML's layout file, and reports
//     nvidia.com/mig.config.state pending → success or failed.
//
// So if Loom rendered the operands without their ordering, or with a config
// the containers could not use, the simulated node shows it.
type NodeSim struct {
	c         *Cluster
	namespace string

	mu    sync.Mutex
	nodes map[string]*SimNode
	// Devices computes the allocatable GPU resources a started device
	// plugin advertises (DevicePluginResources); MIG resolves a MIG
	// manager's layout (MIGManagerLayout).
	Devices DevicesFunc
	MIG     MIGFunc
}

// SimNode is one node's simulated host state.
type SimNode struct {
	Name string
	// Dir is the node's simulated host: driver root, MIG layout file.
	Dir string
	// Markers are the validation markers written on the node.
	Markers map[string]bool
	// MIGApplied is the layout the MIG manager last applied (or failed).
	MIGApplied string
	// Broken keeps the driver from loading (a failed or missing kernel
	// module): NVML stays unavailable though the driver pod runs.
	Broken bool
	// Host: the node's driver is installed on the host and always loaded;
	// a Loom driver pod there neither loads nor unloads it.
	Host bool
	// Log records what happened on the node, in order, with times.
	Log []SimEvent
}

// SimEvent is one step a simulated node went through.
type SimEvent struct {
	At   time.Time
	What string
}

// DevicesFunc returns the device plugin's allocatable resources for a node,
// given its started device plugin pod, the node and its GPUNode.
type DevicesFunc func(ctx context.Context, c client.Client, pod *corev1.Pod, node *corev1.Node, gn *gpuv1alpha1.GPUNode) (corev1.ResourceList, error)

// MIGFunc resolves a MIG layout for a node with the MIG manager pod's
// mounted config: one MIG spec per GPU line for the simulated NVML's layout
// file, or an error saying why the layout cannot be applied.
type MIGFunc func(ctx context.Context, c client.Client, pod *corev1.Pod, layout string, gn *gpuv1alpha1.GPUNode) ([]string, error)

// DriverLibrary is where, under a driver root, the simulated NVML looks for
// the library (as the real agent looks for libnvidia-ml.so.1).
const DriverLibrary = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"

// StartNodeSim starts acting out the operands of Loom's namespace until ctx
// is done.
func (c *Cluster) StartNodeSim(ctx context.Context, namespace string) *NodeSim {
	s := &NodeSim{c: c, namespace: namespace, nodes: map[string]*SimNode{}, Devices: DevicePluginResources, MIG: MIGManagerLayout}
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := s.step(ctx); err != nil && ctx.Err() == nil {
					c.opts.Logf("node sim: %v", err)
				}
			}
		}
	}()
	return s
}

// Add registers a bare node (its agent runs with spec's Bare, DriverRoot
// and MIGFile, which Add fills in) and returns the spec to run its agent
// with. With spec.HostDriver the node's driver is the host's instead:
// loaded from the start, whatever Loom's driver pods do.
func (s *NodeSim) Add(spec AgentSpec) (AgentSpec, error) {
	dir := filepath.Join(s.c.Dir, "nodes", spec.Node)
	if err := os.MkdirAll(filepath.Join(dir, "driver-root"), 0o755); err != nil {
		return spec, err
	}
	spec.Bare, spec.DriverRoot, spec.MIGFile = !spec.HostDriver, filepath.Join(dir, "driver-root"), filepath.Join(dir, "mig-layout")
	n := &SimNode{Name: spec.Node, Dir: dir, Markers: map[string]bool{}, Host: spec.HostDriver}
	if n.Host {
		if err := n.driver(true); err != nil {
			return spec, err
		}
	}
	// A MIG layout shows at the agent's next collection (NVML sends no
	// event for it): collect often, as a short test needs.
	spec.Args = append(spec.Args, "--interval=3s")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes[spec.Node] = n
	return spec, nil
}

// BreakDriver makes the node's driver fail to load (or load again).
func (s *NodeSim) BreakDriver(node string, broken bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.nodes[node]; ok {
		n.Broken = broken
		if broken {
			_ = n.driver(false)
		}
	}
}

// Events returns what happened on a node so far.
func (s *NodeSim) Events(node string) []SimEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.nodes[node]; ok {
		return append([]SimEvent(nil), n.Log...)
	}
	return nil
}

func (n *SimNode) record(format string, args ...any) {
	n.Log = append(n.Log, SimEvent{At: time.Now(), What: fmt.Sprintf(format, args...)})
}

func (s *NodeSim) step(ctx context.Context) error {
	pods := &corev1.PodList{}
	if err := s.c.Client.List(ctx, pods, client.InNamespace(s.namespace), client.HasLabels{gpuv1alpha1.LabelComponent}); err != nil {
		return err
	}
	byNode := map[string][]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != "" {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []string
	for name, n := range s.nodes {
		if err := s.stepNode(ctx, n, byNode[name]); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", name, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// stepNode acts out one node's operand pods in dependency order: a pod
// starts once its init containers are satisfied; what it then does may
// satisfy later pods' init containers within the same step.
func (s *NodeSim) stepNode(ctx context.Context, n *SimNode, pods []*corev1.Pod) error {
	started := map[string]*corev1.Pod{}
	for changed := true; changed; {
		changed = false
		for _, p := range pods {
			comp := p.Labels[gpuv1alpha1.LabelComponent]
			if started[comp] == p {
				// A running validator validates once what it checks works.
				changed = n.validate(comp, p, started) || changed
				continue
			}
			if started[comp] != nil || !running(p) || !n.initDone(p, started) {
				continue
			}
			started[comp], changed = p, true
			if err := n.start(comp, p, started); err != nil {
				return err
			}
		}
	}
	if started[gpuv1alpha1.OperandDriver] == nil && !n.Host {
		if err := n.driver(false); err != nil {
			return err
		}
	}
	node := &corev1.Node{}
	if err := s.c.Client.Get(ctx, client.ObjectKey{Name: n.Name}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	gn := &gpuv1alpha1.GPUNode{}
	if err := s.c.Client.Get(ctx, client.ObjectKey{Name: n.Name}, gn); client.IgnoreNotFound(err) != nil {
		return err
	}
	if err := s.devicePlugin(ctx, n, started[gpuv1alpha1.OperandDevicePlugin], node, gn); err != nil {
		return err
	}
	return s.migManager(ctx, n, started[gpuv1alpha1.OperandMIGManager], node, gn)
}

// start is what a pod's container does once it runs: the driver loads,
// the validator validates.
func (n *SimNode) start(comp string, p *corev1.Pod, started map[string]*corev1.Pod) error {
	if comp == gpuv1alpha1.OperandDriver {
		if n.Host {
			return nil
		}
		return n.driver(!n.Broken)
	}
	n.validate(comp, p, started)
	return nil
}

// validate writes a validator pod's marker (its COMPONENT env) once that
// component works; it reports whether it wrote one.
func (n *SimNode) validate(comp string, p *corev1.Pod, started map[string]*corev1.Pod) bool {
	c := containerEnv(p, "COMPONENT")
	if comp != gpuv1alpha1.OperandValidator || c == "" || n.Markers[c+"-ready"] || !n.works(c, started) {
		return false
	}
	n.mark(c + "-ready")
	return true
}

// initDone reports whether every init container of p lets it start, and
// writes the markers its validations produce.
func (n *SimNode) initDone(p *corev1.Pod, started map[string]*corev1.Pod) bool {
	for _, ic := range p.Spec.InitContainers {
		switch {
		case strings.HasPrefix(ic.Name, "wait-for-"):
			if !n.Markers[strings.TrimPrefix(ic.Name, "wait-for-")+"-ready"] {
				return false
			}
		case strings.HasSuffix(ic.Name, "-validation"):
			comp := strings.TrimSuffix(ic.Name, "-validation")
			if !n.works(comp, started) {
				return false
			}
			n.mark(comp + "-ready")
		}
	}
	return true
}

// works reports whether a validated component works on the node: the driver
// once its pod started (a host's driver always), the toolkit once its pod
// started.
func (n *SimNode) works(comp string, started map[string]*corev1.Pod) bool {
	switch comp {
	case "driver":
		return n.Host || started[gpuv1alpha1.OperandDriver] != nil && !n.Broken
	case "toolkit":
		return started[gpuv1alpha1.OperandToolkit] != nil
	}
	return false
}

func (n *SimNode) mark(m string) {
	if !n.Markers[m] {
		n.Markers[m] = true
		n.record("marker %s", m)
	}
}

// driver loads or unloads the simulated driver. Unloading also removes the
// markers, as a host's /run/nvidia/validations is cleared when the driver
// container goes (the validator writes them again).
func (n *SimNode) driver(loaded bool) error {
	lib := filepath.Join(n.Dir, "driver-root", DriverLibrary)
	_, err := os.Stat(lib)
	present := err == nil
	switch {
	case loaded && !present:
		if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(lib, nil, 0o644); err != nil {
			return err
		}
		n.record("driver loaded")
	case !loaded && present:
		if err := os.Remove(lib); err != nil {
			return err
		}
		n.Markers = map[string]bool{}
		n.record("driver unloaded")
	}
	return nil
}

func (n *SimNode) loaded() bool {
	_, err := os.Stat(filepath.Join(n.Dir, "driver-root", DriverLibrary))
	return err == nil
}

// devicePlugin sets the node's GPU resources from a started device plugin,
// and removes them when none runs (kubelet drops a plugin's resources when
// it unregisters).
func (s *NodeSim) devicePlugin(ctx context.Context, n *SimNode, pod *corev1.Pod, node *corev1.Node, gn *gpuv1alpha1.GPUNode) error {
	want := corev1.ResourceList{}
	if pod != nil && s.Devices != nil && len(gn.Status.GPUs) > 0 && n.loaded() {
		var err error
		if want, err = s.Devices(ctx, s.c.Client, pod, node, gn); err != nil {
			return fmt.Errorf("device plugin: %w", err)
		}
	}
	have := corev1.ResourceList{}
	for name, q := range node.Status.Allocatable {
		if strings.HasPrefix(string(name), gpuv1alpha1.LabelPrefix) {
			have[name] = q
		}
	}
	if equalResources(want, have) {
		return nil
	}
	res := map[string]any{}
	for name := range have {
		res[string(name)] = nil
	}
	for name, q := range want {
		res[string(name)] = q.String()
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": res, "allocatable": res}})
	if err != nil {
		return err
	}
	if err := s.c.Client.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return err
	}
	n.record("device plugin advertises %s", describeResources(want))
	return nil
}

// migManager applies the node's MIG layout once, when its label names a new
// one and a MIG manager runs on the node.
func (s *NodeSim) migManager(ctx context.Context, n *SimNode, pod *corev1.Pod, node *corev1.Node, gn *gpuv1alpha1.GPUNode) error {
	layout := node.Labels[gpuv1alpha1.LabelMIGConfig]
	if pod == nil || s.MIG == nil || layout == "" || len(gn.Status.GPUs) == 0 {
		return nil
	}
	state := node.Labels[gpuv1alpha1.LabelMIGConfigState]
	if layout != n.MIGApplied {
		lines, err := s.MIG(ctx, s.c.Client, pod, layout, gn)
		n.MIGApplied = layout
		if err != nil {
			n.record("MIG layout %s failed: %v", layout, err)
			return s.labelMIGState(ctx, node, "failed")
		}
		if err := os.WriteFile(filepath.Join(n.Dir, "mig-layout"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			return err
		}
		n.record("MIG layout %s applying: %v", layout, lines)
		return s.labelMIGState(ctx, node, "pending")
	}
	if state == "pending" && migMatches(gn, n) {
		n.record("MIG layout %s applied", layout)
		return s.labelMIGState(ctx, node, "success")
	}
	return nil
}

func (s *NodeSim) labelMIGState(ctx context.Context, node *corev1.Node, state string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{gpuv1alpha1.LabelMIGConfigState: state}}})
	if err != nil {
		return err
	}
	return s.c.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, patch))
}

// migMatches reports whether the GPUNode shows the layout last written to
// the node's layout file: every GPU with the devices its line asks for.
func migMatches(gn *gpuv1alpha1.GPUNode, n *SimNode) bool {
	b, err := os.ReadFile(filepath.Join(n.Dir, "mig-layout"))
	if err != nil {
		return false
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for i, g := range gn.Status.GPUs {
		spec := lines[0]
		if len(lines) > 1 && i < len(lines) {
			spec = lines[i]
		}
		if !equalCounts(migCounts(g), specCounts(spec)) {
			return false
		}
	}
	return true
}

// migCounts counts a GPU's MIG devices by profile (nil when MIG is off).
func migCounts(g gpuv1alpha1.GPU) map[string]int {
	if g.MIG == nil || g.MIG.CurrentMode != gpuv1alpha1.MIGEnabled {
		return nil
	}
	counts := map[string]int{}
	for _, d := range g.MIG.Devices {
		counts[d.Profile]++
	}
	return counts
}

// specCounts reads a layout line: "disabled" or PROFILE:COUNT pairs.
func specCounts(spec string) map[string]int {
	spec = strings.TrimSpace(spec)
	if spec == "disabled" || spec == "" {
		return nil
	}
	counts := map[string]int{}
	for _, part := range strings.Split(spec, ",") {
		name, count, _ := strings.Cut(strings.TrimSpace(part), ":")
		c := 1
		if count != "" {
			if _, err := fmt.Sscanf(count, "%d", &c); err != nil {
				return map[string]int{"invalid": 1}
			}
		}
		counts[name] += c
	}
	return counts
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func running(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning
}

func containerEnv(p *corev1.Pod, name string) string {
	for _, c := range p.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value
			}
		}
	}
	return ""
}

func equalResources(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}

func describeResources(l corev1.ResourceList) string {
	if len(l) == 0 {
		return "nothing"
	}
	var parts []string
	for k, v := range l {
		parts = append(parts, fmt.Sprintf("%s=%s", k, v.String()))
	}
	return strings.Join(parts, ", ")
}

// Quantity is a count as a resource quantity.
func Quantity(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }
