package framework

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/migparted"
	"github.com/loom-dev/loom/internal/sharing"
)

// DevicePluginResources is what the NVIDIA device plugin advertises on a
// node: its healthy GPUs under the MIG strategy of its MIG_STRATEGY env
// (none: whole GPUs only; single: a MIG node's devices as nvidia.com/gpu;
// mixed: one nvidia.com/mig-<profile> per profile, a '+' in it written '.'), each device times the
// replicas its sharing config gives that resource, under the renamed name
// when the config renames it. The config is the one the pod mounts, chosen
// for the node as the config manager does.
func DevicePluginResources(ctx context.Context, c client.Client, pod *corev1.Pod, node *corev1.Node, gn *gpuv1alpha1.GPUNode) (corev1.ResourceList, error) {
	cfg, err := devicePluginConfig(ctx, c, pod, node)
	if err != nil {
		return nil, err
	}
	counts := map[string]int64{}
	strategy := containerEnv(pod, "MIG_STRATEGY")
	for _, g := range gn.Status.GPUs {
		if g.Health.State == gpuv1alpha1.GPUUnhealthy {
			continue
		}
		mig := migCounts(g)
		switch {
		case mig == nil:
			counts["nvidia.com/gpu"]++
		case strategy == string(gpuv1alpha1.MIGStrategySingle):
			for _, n := range mig {
				counts["nvidia.com/gpu"] += int64(n)
			}
		case strategy == string(gpuv1alpha1.MIGStrategyMixed):
			for p, n := range mig {
				counts["nvidia.com/mig-"+inventory.MIGProfileName(p)] += int64(n)
			}
		}
	}
	out := corev1.ResourceList{}
	for name, n := range counts {
		r := cfg.Resource(name)
		out[corev1.ResourceName(r.Advertised())] = Quantity(n * int64(max(r.Replicas, 1)))
	}
	return out, nil
}

// devicePluginConfig is the sharing config the device plugin pod runs
// with on the node: the policy's inline time-slicing or the ConfigMap the
// pod mounts, keyed by the node's label or the default.
func devicePluginConfig(ctx context.Context, c client.Client, pod *corev1.Pod, node *corev1.Node) (sharing.Node, error) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	if err := c.Get(ctx, client.ObjectKey{Name: pod.Labels[gpuv1alpha1.LabelPolicy]}, cp); err != nil {
		return sharing.Node{}, fmt.Errorf("the device plugin's ClusterPolicy: %w", err)
	}
	src := sharing.Source{Policy: cp.Spec.DevicePlugin.Config, Namespace: pod.Namespace}
	if name := mountedConfigMap(pod); name != "" {
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, cm); client.IgnoreNotFound(err) != nil {
			return sharing.Node{}, err
		} else if err == nil {
			src.Data = cm.Data
		}
	}
	return sharing.ForNode(src, node.Labels)
}

// mountedConfigMap is the first ConfigMap a pod mounts.
func mountedConfigMap(pod *corev1.Pod) string {
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap != nil {
			return v.ConfigMap.Name
		}
	}
	return ""
}

// MIGManagerLayout resolves layout as the MIG manager does, from the
// mig-parted config the pod mounts (the file its CONFIG_FILE env names),
// for the node's GPUs (their PCI device IDs from the GPUNode), and writes
// it as the simulated NVML's layout lines, one per GPU.
func MIGManagerLayout(ctx context.Context, c client.Client, pod *corev1.Pod, layout string, gn *gpuv1alpha1.GPUNode) ([]string, error) {
	name := mountedConfigMap(pod)
	if name == "" {
		return nil, fmt.Errorf("the MIG manager pod mounts no config")
	}
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, cm); err != nil {
		return nil, fmt.Errorf("MIG config ConfigMap %s: %w", name, err)
	}
	key := path.Base(containerEnv(pod, "CONFIG_FILE"))
	data, ok := cm.Data[key]
	if !ok {
		return nil, fmt.Errorf("MIG config ConfigMap %s has no key %q (the MIG manager's CONFIG_FILE)", name, key)
	}
	cfg, err := migparted.Parse([]byte(data))
	if err != nil {
		return nil, err
	}
	ids := map[string]string{}
	for _, d := range gn.Status.PCIDevices {
		ids[busKey(d.BusID)] = d.DeviceID
	}
	gpus := make([]migparted.GPU, 0, len(gn.Status.GPUs))
	for _, g := range gn.Status.GPUs {
		gpus = append(gpus, migparted.GPU{Index: int(g.Index), PCIDeviceID: ids[busKey(g.PCIBusID)]})
	}
	results, err := migparted.Resolve(cfg, layout, gpus)
	if err != nil {
		return nil, err
	}
	lines := make([]string, len(results))
	for i, r := range results {
		lines[i] = layoutLine(r)
	}
	return lines, nil
}

func layoutLine(r migparted.Result) string {
	if !r.MIGEnabled || len(r.Devices) == 0 {
		return "disabled"
	}
	profiles := make([]string, 0, len(r.Devices))
	for p := range r.Devices {
		profiles = append(profiles, p)
	}
	sort.Strings(profiles)
	parts := make([]string, len(profiles))
	for i, p := range profiles {
		parts[i] = fmt.Sprintf("%s:%d", p, r.Devices[p])
	}
	return strings.Join(parts, ",")
}

// busKey is a PCI address without its domain, which NVML writes with eight
// digits and sysfs with four: 00000000:18:00.0 and 0000:18:00.0 are 18:00.0.
func busKey(bus string) string {
	if _, rest, ok := strings.Cut(bus, ":"); ok && strings.Count(bus, ":") == 2 {
		bus = rest
	}
	return strings.ToLower(bus)
}
