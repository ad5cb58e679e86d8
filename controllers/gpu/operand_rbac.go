package gpu

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
func (r *PolicyReconciler) rbacName(op string) string { return r.Namespace + "-" + objectName(op) }

// operandRBACObjects builds the operand's (Cluster)Roles and bindings.
func (r *PolicyReconciler) operandRBACObjects(cp *gpuv1alpha1.ClusterPolicy, op string) []client.Object {
	rules, ok := operandRules[op]
	if !ok {
		return nil
	}
	owner := []metav1.OwnerReference{*metav1.NewControllerRef(cp, gpuv1alpha1.GroupVersion.WithKind("ClusterPolicy"))}
	sa := []rbacv1.Subject{{Kind: "ServiceAccount", Name: objectName(op), Namespace: r.Namespace}}
	meta := func(name, ns string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: operandLabels(op, cp), OwnerReferences: owner}
	}
	var objs []client.Object
	if len(rules.cluster) > 0 {
		name := r.rbacName(op)
		objs = append(objs,
			&rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"}, ObjectMeta: meta(name, ""), Rules: rules.cluster},
			&rbacv1.ClusterRoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"}, ObjectMeta: meta(name, ""),
				RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name}, Subjects: sa})
	}
	if len(rules.namespaced) > 0 {
		name := objectName(op)
		objs = append(objs,
			&rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"}, ObjectMeta: meta(name, r.Namespace), Rules: rules.namespaced},
			&rbacv1.RoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"}, ObjectMeta: meta(name, r.Namespace),
				RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name}, Subjects: sa})
	}
	return objs
}

// ensureOperandRBAC applies the operand's RBAC objects that the cache (a
// metadata-only one) does not show with the rules hash Loom applied.
func (r *PolicyReconciler) ensureOperandRBAC(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, op string) error {
	for _, obj := range r.operandRBACObjects(cp, op) {
		hash := hashOf(obj)
		obj.SetAnnotations(map[string]string{AnnotationSpecHash: hash})
		have := &metav1.PartialObjectMetadata{}
		have.SetGroupVersionKind(obj.GetObjectKind().GroupVersionKind())
		err := r.Get(ctx, client.ObjectKeyFromObject(obj), have)
		if err == nil && have.Annotations[AnnotationSpecHash] == hash {
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if err := r.apply(ctx, obj); err != nil {
			return fmt.Errorf("%s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
		}
	}
	return nil
}

// removeOperandRBAC deletes the operand's RBAC objects (Loom's only).
func (r *PolicyReconciler) removeOperandRBAC(ctx context.Context, op string) error {
	keys := []struct {
		obj client.Object
		key client.ObjectKey
	}{
		{&rbacv1.ClusterRole{}, client.ObjectKey{Name: r.rbacName(op)}},
		{&rbacv1.ClusterRoleBinding{}, client.ObjectKey{Name: r.rbacName(op)}},
		{&rbacv1.Role{}, client.ObjectKey{Namespace: r.Namespace, Name: objectName(op)}},
		{&rbacv1.RoleBinding{}, client.ObjectKey{Namespace: r.Namespace, Name: objectName(op)}},
	}
	for _, k := range keys {
		have := &metav1.PartialObjectMetadata{}
		gvk, err := r.GroupVersionKindFor(k.obj)
		if err != nil {
			return err
		}
		have.SetGroupVersionKind(gvk)
		if err := r.Get(ctx, k.key, have); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return err
		}
		if have.Labels[LabelManagedBy] != managedBy {
			continue
		}
		if err := r.Delete(ctx, have); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}
