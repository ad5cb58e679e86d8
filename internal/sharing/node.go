package sharing

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// Source is where the nodes' device plugin configs come from: a
// ClusterPolicy's spec.devicePlugin.config and, when it names one, its
// ConfigMap.
type Source struct {
	// Policy is the ClusterPolicy's spec.devicePlugin.config; nil: no
	// sharing on any node.
	Policy *gpuv1alpha1.DevicePluginConfig
	// Namespace is the ConfigMap's namespace (Loom's), for messages.
	Namespace string
	// Data is the ConfigMap's data; nil when Policy names a ConfigMap that
	// does not exist.
	Data map[string]string
}

// Read is the Source of a ClusterPolicy (nil: none, so no sharing),
// reading its ConfigMap, when it names one, from namespace (Loom's)
// through r. A missing ConfigMap is a Source without Data.
func Read(ctx context.Context, r client.Reader, cp *gpuv1alpha1.ClusterPolicy, namespace string) (Source, error) {
	src := Source{Namespace: namespace}
	if cp != nil {
		src.Policy = cp.Spec.DevicePlugin.Config
	}
	if p := src.Policy; p != nil && p.TimeSlicing == nil && p.ConfigMapName != "" {
		cm := &corev1.ConfigMap{}
		switch err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: p.ConfigMapName}, cm); {
		case err == nil:
			src.Data = cm.Data
			if src.Data == nil {
				src.Data = map[string]string{}
			}
		case !apierrors.IsNotFound(err):
			return src, err
		}
	}
	return src, nil
}

// Node is the config a node's device plugin runs with.
type Node struct {
	// Key is the ConfigMap key chosen, "" for inline time-slicing or none.
	Key string
	// Config is nil when the node runs without a config (no sharing).
	Config *Config
}

// Error is a config that cannot be used: the ConfigMap is missing, the
// node's label names a key it does not have, or the key does not parse.
type Error struct {
	ConfigMap string // namespace/name
	Key       string
	Err       error
}

func (e *Error) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("device plugin config ConfigMap %s: %v", e.ConfigMap, e.Err)
	}
	return fmt.Sprintf("device plugin config ConfigMap %s, key %q: %v", e.ConfigMap, e.Key, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ForNode chooses the node's config as GPU Operator's config manager does:
// the key its nvidia.com/device-plugin.config label names, otherwise the
// policy's defaultConfig; neither means no config (no sharing). Inline
// time-slicing applies to every node. The result is an *Error when the
// config cannot be used.
func ForNode(src Source, nodeLabels map[string]string) (Node, error) {
	p := src.Policy
	switch {
	case p == nil:
		return Node{}, nil
	case p.TimeSlicing != nil:
		return Node{Config: inline(p.TimeSlicing)}, nil
	case p.ConfigMapName == "":
		return Node{}, nil
	}
	cm := src.Namespace + "/" + p.ConfigMapName
	key := nodeLabels[gpuv1alpha1.LabelDevicePluginConfig]
	if key == "" {
		key = p.DefaultConfig
	}
	if key == "" {
		return Node{}, nil
	}
	if src.Data == nil {
		return Node{}, &Error{ConfigMap: cm, Err: fmt.Errorf("not found")}
	}
	data, ok := src.Data[key]
	if !ok {
		return Node{}, &Error{ConfigMap: cm, Key: key, Err: fmt.Errorf("no such key (the node's %s label or the policy's defaultConfig names it)",
			gpuv1alpha1.LabelDevicePluginConfig)}
	}
	c, err := Parse([]byte(data))
	if err != nil {
		return Node{}, &Error{ConfigMap: cm, Key: key, Err: err}
	}
	return Node{Key: key, Config: c}, nil
}

// inline is the config of a policy's inline time-slicing (already
// validated by the API: names nvidia.com/..., replicas 2 to 64).
func inline(ts *gpuv1alpha1.TimeSlicingSpec) *Config {
	r := &Replicated{RenameByDefault: ts.RenameByDefault}
	for _, res := range ts.Resources {
		rr := ReplicatedResource{Name: res.Name, Replicas: int(res.Replicas), Devices: Devices{All: true}}
		if ts.RenameByDefault {
			rr.Rename = res.Name + ".shared"
		}
		r.Resources = append(r.Resources, rr)
	}
	return &Config{Version: "v1", Sharing: Sharing{TimeSlicing: r}}
}

// Resource is how the device plugin advertises one resource.
type Resource struct {
	// Name is the resource, e.g. nvidia.com/gpu.
	Name string
	// Replicas of each shared device; 1 when the resource is not shared.
	Replicas int
	// Strategy is none when Replicas is 1.
	Strategy Strategy
	// Rename is the name the shared devices are advertised under; "" when
	// they keep Name.
	Rename string
	// Devices are the devices replicated (all when not shared).
	Devices Devices
}

// Shared reports whether the resource's devices are replicated.
func (r Resource) Shared() bool { return r.Replicas > 1 }

// Renamed reports whether the shared devices are advertised under another
// name.
func (r Resource) Renamed() bool { return r.Shared() && r.Rename != "" }

// Advertised is the name the shared devices are advertised under.
func (r Resource) Advertised() string {
	if r.Renamed() {
		return r.Rename
	}
	return r.Name
}

// Resource is how the node's device plugin advertises name (nvidia.com/gpu,
// nvidia.com/mig-1g.10gb, or the name without its prefix).
func (n Node) Resource(name string) Resource {
	if full, err := resourceName(name); err == nil {
		name = full
	}
	out := Resource{Name: name, Replicas: 1, Strategy: StrategyNone, Devices: Devices{All: true}}
	if n.Config == nil {
		return out
	}
	section, strategy := n.Config.Sharing.TimeSlicing, StrategyTimeSlicing
	if n.Config.Sharing.MPS != nil {
		section, strategy = n.Config.Sharing.MPS, StrategyMPS
	}
	if section == nil {
		return out
	}
	for _, r := range section.Resources {
		if r.Name == name {
			return Resource{Name: name, Replicas: r.Replicas, Strategy: strategy, Rename: r.Rename, Devices: r.Devices}
		}
	}
	return out
}

// Allocatable is what the device plugin advertises for a resource with
// devices physical devices (their indexes 0..devices-1): the replicated
// devices, Replicas each, under Advertised(); the others, one each, under
// Name. A GPU index beyond the node's devices matches nothing; a UUID or
// MIG index is taken to match one device.
func (r Resource) Allocatable(devices int) map[string]int64 {
	if devices <= 0 {
		return map[string]int64{}
	}
	if !r.Shared() {
		return map[string]int64{r.Name: int64(devices)}
	}
	shared := devices
	switch {
	case r.Devices.Count > 0:
		shared = min(r.Devices.Count, devices)
	case len(r.Devices.List) > 0:
		shared = min(listed(r.Devices.List, devices), devices)
	}
	out := map[string]int64{}
	out[r.Advertised()] += int64(shared) * int64(r.Replicas)
	if rest := devices - shared; rest > 0 {
		out[r.Name] += int64(rest)
	}
	return out
}

// listed counts the entries of a devices list that match one of devices.
func listed(list []string, devices int) int {
	n := 0
	for _, ref := range list {
		if i, err := strconv.Atoi(ref); err == nil && i >= devices {
			continue
		}
		n++
	}
	return n
}

// Backing is the resource whose devices name is advertised from: the
// original of a rename (rename: nvidia.com/small of nvidia.com/mig-1g.10gb
// is backed by that MIG profile's devices), else name itself.
func (n Node) Backing(name string) string {
	if n.Config == nil {
		return name
	}
	for _, s := range []*Replicated{n.Config.Sharing.TimeSlicing, n.Config.Sharing.MPS} {
		if s == nil {
			continue
		}
		for _, r := range s.Resources {
			if r.Rename == name && r.Replicas > 1 {
				return r.Name
			}
		}
	}
	return name
}

// OnePerContainer says whether the node's device plugin refuses a
// container asking for more than one unit of the resource it advertises
// under name, and under which strategy: it does when every unit of name is
// a replica and the config is MPS (always) or time-slicing with
// failRequestsGreaterThanOne. Kubelet then fails the pod at admission
// (UnexpectedAdmissionError). A name that carries replicas and whole
// devices alike (devices: a count or a list, without a rename) may be
// given either: not counted.
func (n Node) OnePerContainer(name string) (Strategy, bool) {
	if n.Config == nil {
		return "", false
	}
	section, strategy := n.Config.Sharing.TimeSlicing, StrategyTimeSlicing
	if n.Config.Sharing.MPS != nil {
		section, strategy = n.Config.Sharing.MPS, StrategyMPS
	}
	if section == nil || (strategy == StrategyTimeSlicing && !section.FailRequestsGreaterThanOne) {
		return "", false
	}
	for _, r := range section.Resources {
		if r.Rename == name || (r.Rename == "" && r.Name == name && r.Devices.All) {
			return strategy, true
		}
	}
	return "", false
}

// Where names the config for messages: the ClusterPolicy's inline
// time-slicing, or the ConfigMap and key.
func (n Node) Where(src Source) string {
	if n.Key == "" {
		return "the ClusterPolicy's inline time-slicing"
	}
	return fmt.Sprintf("device plugin config %q of ConfigMap %s/%s", n.Key, src.Namespace, src.Policy.ConfigMapName)
}
