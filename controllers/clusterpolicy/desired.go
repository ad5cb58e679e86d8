package clusterpolicy

import (
	"reflect"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// cluster is what the children depend on beside the policy: the GPU nodes
// (their OS picks the driver images) and the user ConfigMaps the policy
// names (their content is hashed onto the operands that read them; a
// missing one is absent from the map).
type cluster struct {
	nodes      []corev1.Node
	configMaps map[string]*corev1.ConfigMap
}

// plan is every child the policy wants, and what it holds back.
type plan struct {
	objects []client.Object
	// held are operands whose DaemonSets are neither written nor removed
	// (a ConfigMap they read is missing), with why.
	held map[string]string
	// noDriver names the GPU nodes that get no driver, with why.
	noDriver []string
	// targets are the GPU nodes' gpu.loom.dev/driver-target labels, by
	// node name: what places each on its driver DaemonSet (none: no label).
	targets map[string]string
}

// desired is every child the policy wants, a pure function of the policy,
// Loom's namespace and the cluster: the NVIDIA RuntimeClass, then per
// enabled operand (in dependency order) its ServiceAccount, RBAC and
// DaemonSets, the device plugin's time-slicing ConfigMap and the MIG
// manager's built-in layouts. Owner references and Loom's managed-by label
// are the writer's to add.
func desired(cp *gpuv1alpha1.ClusterPolicy, namespace string, in cluster) plan {
	p := plan{held: map[string]string{}, objects: []client.Object{&nodev1.RuntimeClass{
		TypeMeta:   typeMeta("node.k8s.io/v1", "RuntimeClass"),
		ObjectMeta: metav1.ObjectMeta{Name: RuntimeClassName},
		Handler:    RuntimeClassName,
	}}}
	on, _ := enabledOperands(cp)
	for _, op := range on {
		p.objects = append(p.objects, &corev1.ServiceAccount{TypeMeta: typeMeta("v1", "ServiceAccount"),
			ObjectMeta: metav1.ObjectMeta{Name: objectName(op.name), Namespace: namespace, Labels: operandLabels(op.name, cp)}})
		p.objects = append(p.objects, operandRBACObjects(cp, namespace, op.name)...)
		if op.name == gpuv1alpha1.OperandDriver {
			groups, noDriver := driverGroups(cp, in.nodes)
			p.noDriver, p.targets = noDriver, driverTargets(groups)
			for _, ds := range driverDaemonSets(cp, namespace, groups) {
				p.objects = append(p.objects, ds)
			}
			continue
		}
		data, ok, why := configContent(op.name, cp, namespace, in.configMaps)
		if !ok {
			p.held[op.name] = why
			continue
		}
		v := variant{configData: data}
		if op.name == gpuv1alpha1.OperandToolkit {
			v.runtime = toolkitRuntime(cp, in.nodes)
		}
		p.objects = append(p.objects, buildDaemonSet(op, cp, namespace, v))
	}
	if cm := DevicePluginConfigMap(cp, namespace); cm != nil && cp.Spec.OperandEnabled(gpuv1alpha1.OperandDevicePlugin) {
		p.objects = append(p.objects, cm)
	}
	if cm := MIGConfigMap(cp, namespace); cm != nil && cp.Spec.OperandEnabled(gpuv1alpha1.OperandMIGManager) {
		p.objects = append(p.objects, cm)
	}
	return p
}

// undesired names every child a policy can have that want does not hold:
// the children of disabled operands, driver DaemonSets of an OS no GPU
// node runs any more (existing lists the driver DaemonSets there are), and
// ConfigMaps no longer needed. A held operand's DaemonSet stays. The writer
// removes those Loom controls.
func undesired(namespace string, p plan, existing []string) []client.Object {
	var all []client.Object
	for _, op := range operands {
		name, cluster := objectName(op.name), rbacName(namespace, op.name)
		all = append(all,
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: cluster}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: cluster}},
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}})
		if _, held := p.held[op.name]; !held {
			all = append(all, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}})
		}
	}
	for _, name := range existing {
		if name != objectName(gpuv1alpha1.OperandDriver) {
			all = append(all, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}})
		}
	}
	all = append(all, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: devicePluginConfigName, Namespace: namespace}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: migConfigName, Namespace: namespace}})
	return slices.DeleteFunc(all, func(o client.Object) bool {
		return slices.ContainsFunc(p.objects, func(w client.Object) bool { return sameChild(o, w) })
	})
}

// sameChild reports whether a and b name the same object (same Go type,
// namespace and name).
func sameChild(a, b client.Object) bool {
	return a.GetName() == b.GetName() && a.GetNamespace() == b.GetNamespace() && reflect.TypeOf(a) == reflect.TypeOf(b)
}
