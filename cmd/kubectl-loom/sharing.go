package main

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/sharing"
)

// listPolicies lists the ClusterPolicies (a NoMatch error without Loom's
// CRDs).
func listPolicies(ctx context.Context, c client.Client) ([]gpuv1alpha1.ClusterPolicy, error) {
	var cps []gpuv1alpha1.ClusterPolicy
	l := &gpuv1alpha1.ClusterPolicyList{}
	if err := pages(ctx, c, l, func() { cps = append(cps, l.Items...) }); err != nil {
		return nil, err
	}
	return cps, nil
}

// sharingSource reads the device plugin configs of the ClusterPolicy in
// force, as the manager does, so that the plugin calls the same resources
// GPUs (sharing.NamesOf: a resource the configs rename is one, a NIC's
// nvidia.com/rdma_shared is not). Its ConfigMap is in Loom's namespace,
// found as the namespace of the policy's operand DaemonSets. What the user
// may not read, or does not exist, is left out: the device plugin's own
// names (nvidia.com/gpu, nvidia.com/mig-*, their .shared forms) stand.
func sharingSource(ctx context.Context, c client.Client) (sharing.Source, error) {
	cps, err := listPolicies(ctx, c)
	if meta.IsNoMatchError(err) {
		return sharing.Source{}, nil
	}
	if err != nil {
		return sharing.Source{}, ignoreForbidden(err)
	}
	return policySharing(ctx, c, gpuv1alpha1.Active(cps))
}

// policySharing is sharingSource for the policy in force, cp (nil: none).
func policySharing(ctx context.Context, c client.Client, cp *gpuv1alpha1.ClusterPolicy) (sharing.Source, error) {
	if cp == nil {
		return sharing.Source{}, nil
	}
	src := sharing.Source{Policy: cp.Spec.DevicePlugin.Config}
	if p := src.Policy; p == nil || p.TimeSlicing != nil || p.ConfigMapName == "" {
		return src, nil
	}
	var ns string
	l := &appsv1.DaemonSetList{}
	err := pages(ctx, c, l, func() {
		for i := range l.Items {
			if ref := metav1.GetControllerOf(&l.Items[i]); ns == "" && ref != nil && ref.UID == cp.UID {
				ns = l.Items[i].Namespace
			}
		}
	}, client.MatchingLabels{gpuv1alpha1.LabelPolicy: cp.Name, apply.LabelManagedBy: apply.ManagedBy})
	if err != nil || ns == "" {
		return src, ignoreForbidden(err)
	}
	read, err := sharing.Read(ctx, c, cp, ns)
	if err != nil {
		return src, ignoreForbidden(err)
	}
	return read, nil
}

func ignoreForbidden(err error) error {
	if apierrors.IsForbidden(err) {
		return nil
	}
	return err
}
