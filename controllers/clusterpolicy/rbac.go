package clusterpolicy

import (
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// The operands' own API rights, as GPU Operator grants them (the images'
// Kubernetes clients need them), and no more. Loom holds each right it
// grants: RBAC forbids granting what one does not have.
//
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,namespace=loom-system,resources=roles;rolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch;update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch

// operandRBAC is what one operand may do: cluster-wide rules (nodes) and
// rules in Loom's namespace (its fellow operands' pods).
type operandRBAC struct {
	cluster, namespaced []rbacv1.PolicyRule
}

var (
	readNodes  = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}
	labelNodes = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch", "update"}}
	// restartOperands: the driver manager and the MIG manager stop the
	// operand pods of their node while they work.
	restartOperands = []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "delete"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "watch"}},
	}
)

// operandRules are the rights per operand; an operand not listed gets none
// (its ServiceAccount only).
var operandRules = map[string]operandRBAC{
	// k8s-driver-manager cordons and drains its node, evicting GPU pods.
	gpuv1alpha1.OperandDriver: {
		cluster: []rbacv1.PolicyRule{labelNodes,
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
			{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "watch"}}},
	},
	// The validator reads its node; its CUDA workload check runs pods in
	// Loom's namespace.
	gpuv1alpha1.OperandValidator: {
		cluster:    []rbacv1.PolicyRule{readNodes},
		namespaced: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete"}}},
	},
	// The device plugin's config manager follows nvidia.com/device-plugin.config.
	gpuv1alpha1.OperandDevicePlugin: {cluster: []rbacv1.PolicyRule{readNodes}},
	// The MIG manager follows nvidia.com/mig.config and reports
	// nvidia.com/mig.config.state on its node.
	gpuv1alpha1.OperandMIGManager: {cluster: []rbacv1.PolicyRule{labelNodes}, namespaced: restartOperands},
	// The node status exporter reports its node.
	gpuv1alpha1.OperandNodeStatusExporter: {cluster: []rbacv1.PolicyRule{readNodes}},
}

// rbacName is the name of an operand's ClusterRole and ClusterRoleBinding:
// cluster-scoped, so the namespace is part of it.
func rbacName(namespace, op string) string { return namespace + "-" + objectName(op) }

// operandRBACObjects builds the operand's (Cluster)Roles and bindings.
func operandRBACObjects(cp *gpuv1alpha1.ClusterPolicy, namespace, op string) []client.Object {
	rules, ok := operandRules[op]
	if !ok {
		return nil
	}
	sa := []rbacv1.Subject{{Kind: "ServiceAccount", Name: objectName(op), Namespace: namespace}}
	meta := func(name, ns string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: operandLabels(op, cp)}
	}
	var objs []client.Object
	if len(rules.cluster) > 0 {
		name := rbacName(namespace, op)
		objs = append(objs,
			&rbacv1.ClusterRole{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "ClusterRole"), ObjectMeta: meta(name, ""), Rules: rules.cluster},
			&rbacv1.ClusterRoleBinding{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"), ObjectMeta: meta(name, ""),
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}, Subjects: sa})
	}
	if len(rules.namespaced) > 0 {
		name := objectName(op)
		objs = append(objs,
			&rbacv1.Role{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "Role"), ObjectMeta: meta(name, namespace), Rules: rules.namespaced},
			&rbacv1.RoleBinding{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "RoleBinding"), ObjectMeta: meta(name, namespace),
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: sa})
	}
	return objs
}

func typeMeta(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}
