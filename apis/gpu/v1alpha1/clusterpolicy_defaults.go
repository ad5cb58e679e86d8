package v1alpha1

// Operand names, as they appear in status, object names and the per-node
// opt-out labels nvidia.com/gpu.deploy.<name>=false.
const (
	OperandDriver             = "driver"
	OperandToolkit            = "container-toolkit"
	OperandValidator          = "operator-validator"
	OperandDevicePlugin       = "device-plugin"
	OperandDCGM               = "dcgm"
	OperandDCGMExporter       = "dcgm-exporter"
	OperandMIGManager         = "mig-manager"
	OperandNodeStatusExporter = "node-status-exporter"
)

// OperandDefaults are an operand's built-in image and whether it runs when
// the ClusterPolicy does not say.
type OperandDefaults struct {
	Image   ImageSpec
	Enabled bool
}

// Defaults are the built-in operands, in per-node dependency order.
var Defaults = []struct {
	Name string
	OperandDefaults
}{
	{OperandDriver, OperandDefaults{ImageSpec{Repository: "nvcr.io/nvidia", Image: "driver", Version: "570.172.08"}, true}},
	{OperandToolkit, OperandDefaults{ImageSpec{Repository: "nvcr.io/nvidia/k8s", Image: "container-toolkit", Version: "v1.17.8-ubuntu20.04"}, true}},
	{OperandValidator, OperandDefaults{ImageSpec{Repository: "nvcr.io/nvidia/cloud-native", Image: "gpu-operator-validator", Version: "v25.3.2"}, true}},
	{OperandDevicePlugin, OperandDefaults{ImageSpec{Repository: "nvcr.io/nvidia", Image: "k8s-device-plugin", Version: "v0.17.2"}, true}},
	{OperandDCGM, OperandDefaults{ImageSpec{Repository: "nvcr.io/nvidia/cloud-native", Image: "dcgm", Version: "4.2.3-1-ubuntu22.04"}, false}},
	{OperandDCGMExporter, OperandDefaults{ImageSpec{Repository: "nvcr.io/nvidia/k8s", Image: "dcgm-exporter", Version: "4.2.3-4.1.3-ubuntu22.04"}, true}},
	{OperandMIGManager, OperandDefaults{ImageSpec{Repository: "nvcr.io/nvidia/cloud-native", Image: "k8s-mig-manager", Version: "v0.12.1-ubuntu20.04"}, true}},
	{OperandNodeStatusExporter, OperandDefaults{ImageSpec{Repository: "nvcr.io/nvidia/cloud-native", Image: "gpu-operator-validator", Version: "v25.3.2"}, false}},
}

// DefaultDriverManagerImage is the driver manager's built-in image, GPU
// Operator v25.3.2's (whose validator is the built-in one).
var DefaultDriverManagerImage = ImageSpec{Repository: "nvcr.io/nvidia/cloud-native", Image: "k8s-driver-manager", Version: "v0.8.0"}

// EffectiveImage merges the manager's image over DefaultDriverManagerImage
// field by field and returns it with the full reference.
func (m *DriverManagerSpec) EffectiveImage() (ImageSpec, string) {
	return (&OperandSpec{Image: m.Image}).EffectiveImage(OperandDefaults{Image: DefaultDriverManagerImage})
}

// AfterToolkit are the operands that start on a node only once the
// validator has written its toolkit-ready marker there.
var AfterToolkit = []string{OperandDevicePlugin, OperandDCGM, OperandDCGMExporter, OperandMIGManager, OperandNodeStatusExporter}

// Operand returns the spec of a named operand (nil for an unknown name).
func (s *ClusterPolicySpec) Operand(name string) *OperandSpec {
	switch name {
	case OperandDriver:
		return &s.Driver.OperandSpec
	case OperandToolkit:
		return &s.Toolkit
	case OperandValidator:
		return &s.Validator
	case OperandDevicePlugin:
		return &s.DevicePlugin.OperandSpec
	case OperandDCGM:
		return &s.DCGM
	case OperandDCGMExporter:
		return &s.DCGMExporter.OperandSpec
	case OperandMIGManager:
		return &s.MIGManager.OperandSpec
	case OperandNodeStatusExporter:
		return &s.NodeStatusExporter
	}
	return nil
}

// IsEnabled reports whether the operand runs, given its default.
func (o *OperandSpec) IsEnabled(d OperandDefaults) bool {
	if o.Enabled != nil {
		return *o.Enabled
	}
	return d.Enabled
}

// EffectiveImage merges the operand's image over its default field by field
// and returns it with the full reference (repository/image:version).
func (o *OperandSpec) EffectiveImage(d OperandDefaults) (ImageSpec, string) {
	img := d.Image
	if o.Image.Repository != "" {
		img.Repository = o.Image.Repository
	}
	if o.Image.Image != "" {
		img.Image = o.Image.Image
	}
	if o.Image.Version != "" {
		img.Version = o.Image.Version
	}
	img.PullPolicy = o.Image.PullPolicy
	if img.PullPolicy == "" {
		img.PullPolicy = "IfNotPresent"
	}
	img.PullSecrets = o.Image.PullSecrets
	return img, img.Repository + "/" + img.Image + ":" + img.Version
}

// AutoUpgradeEnabled is AutoUpgrade with its default (on).
func (p *DriverUpgradePolicy) AutoUpgradeEnabled() bool {
	return p.AutoUpgrade == nil || *p.AutoUpgrade
}

// Parallel is MaxParallelUpgrades with its default (1); 0 is unlimited.
func (p *DriverUpgradePolicy) Parallel() int32 {
	if p.MaxParallelUpgrades == nil {
		return 1
	}
	return *p.MaxParallelUpgrades
}

// OperandEnabled reports whether the policy runs the named operand.
func (s *ClusterPolicySpec) OperandEnabled(name string) bool {
	o := s.Operand(name)
	if o == nil {
		return false
	}
	for _, d := range Defaults {
		if d.Name == name {
			return o.IsEnabled(d.OperandDefaults)
		}
	}
	return o.IsEnabled(OperandDefaults{})
}

// DefaultDCGMCountersConfigMap is Loom's dcgm-exporter counters ConfigMap
// (written by the monitoring reconciler): dcgm-exporter's defaults plus the
// ECC and row-remapping fields Loom's alerts need.
const DefaultDCGMCountersConfigMap = "loom-dcgm-exporter-metrics"

// DCGMCountersKey is the counters CSV's key in that ConfigMap (and in one
// the policy names).
const DCGMCountersKey = "dcgm-metrics.csv"

// CountersConfigMap is the counters ConfigMap dcgm-exporter mounts: the
// policy's, or Loom's.
func (s *DCGMExporterSpec) CountersConfigMap() string {
	if s.MetricsConfigMapName != "" {
		return s.MetricsConfigMapName
	}
	return DefaultDCGMCountersConfigMap
}

// Active returns the ClusterPolicy in force among items: the oldest one not
// being deleted (name breaks ties), or nil. Others are ignored.
func Active(items []ClusterPolicy) *ClusterPolicy {
	var best *ClusterPolicy
	for i := range items {
		cp := &items[i]
		if cp.DeletionTimestamp != nil {
			continue
		}
		if best == nil || cp.CreationTimestamp.Before(&best.CreationTimestamp) ||
			(cp.CreationTimestamp.Equal(&best.CreationTimestamp) && cp.Name < best.Name) {
			best = cp
		}
	}
	return best
}
