package clusterpolicy

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/migparted"
)

// namedConfigMap is a user ConfigMap (in Loom's namespace) an operand
// reads, and the field that names it.
type namedConfigMap struct {
	name, field string
}

// namedConfigMaps are the user ConfigMaps each enabled operand reads, by
// operand: their content is hashed onto its pod template, so that an edit
// rolls exactly that operand, and a missing one holds its rollout.
func namedConfigMaps(cp *gpuv1alpha1.ClusterPolicy) map[string]namedConfigMap {
	out := map[string]namedConfigMap{}
	if c := cp.Spec.DevicePlugin.Config; c != nil && c.ConfigMapName != "" {
		out[gpuv1alpha1.OperandDevicePlugin] = namedConfigMap{c.ConfigMapName, "devicePlugin.config.configMapName"}
	}
	if n := cp.Spec.MIGManager.ConfigMapName; n != "" {
		out[gpuv1alpha1.OperandMIGManager] = namedConfigMap{n, "migManager.configMapName"}
	}
	if n := cp.Spec.DCGMExporter.MetricsConfigMapName; n != "" {
		out[gpuv1alpha1.OperandDCGMExporter] = namedConfigMap{n, "dcgmExporter.metricsConfigMapName"}
	}
	for op := range out {
		if !cp.Spec.OperandEnabled(op) {
			delete(out, op)
		}
	}
	return out
}

// configContent is what the operand's pods read from ConfigMaps, hashed
// onto its template: a named ConfigMap's data, or Loom's built-in MIG
// layouts. ok is false when a named ConfigMap does not exist (then the
// message says so).
func configContent(op string, cp *gpuv1alpha1.ClusterPolicy, namespace string, cms map[string]*corev1.ConfigMap) (data any, ok bool, msg string) {
	named, has := namedConfigMaps(cp)[op]
	switch {
	case has:
		cm := cms[named.name]
		if cm == nil {
			return nil, false, fmt.Sprintf("ConfigMap %s/%s (%s) not found: not rolled out until it exists", namespace, named.name, named.field)
		}
		return []any{cm.Data, cm.BinaryData}, true, ""
	case op == gpuv1alpha1.OperandMIGManager:
		return string(migparted.Default()), true, ""
	}
	return nil, true, ""
}

// migConfigMap is the ConfigMap of MIG layouts the MIG manager mounts.
func migConfigMap(cp *gpuv1alpha1.ClusterPolicy) string {
	if n := cp.Spec.MIGManager.ConfigMapName; n != "" {
		return n
	}
	return migConfigName
}

// MIGConfigMap is Loom's ConfigMap of the built-in MIG layouts (nil when
// the policy names its own).
func MIGConfigMap(cp *gpuv1alpha1.ClusterPolicy, namespace string) *corev1.ConfigMap {
	if cp.Spec.MIGManager.ConfigMapName != "" {
		return nil
	}
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: migConfigName, Namespace: namespace, Labels: operandLabels(gpuv1alpha1.OperandMIGManager, cp)},
		Data:       map[string]string{gpuv1alpha1.MIGConfigKey: string(migparted.Default())},
	}
}

// referencesConfigMap reports whether the policy reads the named ConfigMap
// of Loom's namespace.
func referencesConfigMap(cp *gpuv1alpha1.ClusterPolicy, name string) bool {
	for _, n := range namedConfigMaps(cp) {
		if n.name == name {
			return true
		}
	}
	return false
}
