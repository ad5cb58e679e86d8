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

// desired is every child the policy wants, a pure function of the policy
// and Loom's namespace: the NVIDIA RuntimeClass, then per enabled operand
// (in dependency order) its ServiceAccount, RBAC and DaemonSet, and the
// device plugin's time-slicing ConfigMap. Owner references and Loom's
// managed-by label are the writer's to add.
func desired(cp *gpuv1alpha1.ClusterPolicy, namespace string) []client.Object {
	objs := []client.Object{&nodev1.RuntimeClass{
		TypeMeta:   typeMeta("node.k8s.io/v1", "RuntimeClass"),
		ObjectMeta: metav1.ObjectMeta{Name: RuntimeClassName},
		Handler:    RuntimeClassName,
	}}
	on, _ := enabledOperands(cp)
	for _, op := range on {
		objs = append(objs, &corev1.ServiceAccount{TypeMeta: typeMeta("v1", "ServiceAccount"),
			ObjectMeta: metav1.ObjectMeta{Name: objectName(op.name), Namespace: namespace, Labels: operandLabels(op.name, cp)}})
		objs = append(objs, operandRBACObjects(cp, namespace, op.name)...)
		objs = append(objs, BuildDaemonSet(op, cp, namespace))
	}
	if cm := DevicePluginConfigMap(cp, namespace); cm != nil && cp.Spec.DevicePlugin.IsEnabled(defaultsFor(gpuv1alpha1.OperandDevicePlugin)) {
		objs = append(objs, cm)
	}
	return objs
}

// undesired names every child a policy can have that want does not hold:
// the children of disabled operands and a ConfigMap no longer needed. The
// writer removes those Loom controls.
func undesired(namespace string, want []client.Object) []client.Object {
	var all []client.Object
	for _, op := range operands {
		name, cluster := objectName(op.name), rbacName(namespace, op.name)
		all = append(all,
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: cluster}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: cluster}},
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}},
			&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}})
	}
	all = append(all, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: devicePluginConfigName, Namespace: namespace}})
	return slices.DeleteFunc(all, func(o client.Object) bool {
		return slices.ContainsFunc(want, func(w client.Object) bool { return sameChild(o, w) })
	})
}

// sameChild reports whether a and b name the same object (same Go type,
// namespace and name).
func sameChild(a, b client.Object) bool {
	return a.GetName() == b.GetName() && a.GetNamespace() == b.GetNamespace() && reflect.TypeOf(a) == reflect.TypeOf(b)
}
