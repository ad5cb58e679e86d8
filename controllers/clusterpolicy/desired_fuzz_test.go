package clusterpolicy

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
)

// fuzzedPolicy builds a ClusterPolicy from fuzz input: a spec decoded from
// JSON (anything the API could hold; undecodable input leaves it empty),
// then the fields the fuzzer varies directly written over it.
type fuzzedPolicy struct {
	name, namespace            string
	specJSON                   []byte
	repo, image, version       string
	envName, envValue          string
	tolKey, tolValue, tolOp    string
	selKey, selValue, resource string
	replicas                   int32
	flags                      uint16
}

func (in fuzzedPolicy) policy() *gpuv1alpha1.ClusterPolicy {
	cp := &gpuv1alpha1.ClusterPolicy{}
	_ = json.Unmarshal(in.specJSON, &cp.Spec)
	cp.Name = in.name
	ops := []*gpuv1alpha1.OperandSpec{&cp.Spec.Driver.OperandSpec, &cp.Spec.Toolkit, &cp.Spec.Validator, &cp.Spec.DevicePlugin.OperandSpec,
		&cp.Spec.DCGM, &cp.Spec.DCGMExporter.OperandSpec, &cp.Spec.MIGManager.OperandSpec, &cp.Spec.NodeStatusExporter}
	for i, o := range ops {
		// Two bits per operand: leave Enabled alone, or set it on or off.
		switch (in.flags >> (2 * i)) & 3 {
		case 1:
			o.Enabled = ptr.To(true)
		case 2:
			o.Enabled = ptr.To(false)
		}
	}
	o := ops[int(in.flags>>12)%len(ops)]
	if in.repo != "" || in.image != "" || in.version != "" {
		o.Image.Repository, o.Image.Image, o.Image.Version = in.repo, in.image, in.version
	}
	if in.envName != "" {
		o.Env = append(o.Env, corev1.EnvVar{Name: in.envName, Value: in.envValue})
	}
	if in.tolKey != "" || in.tolOp != "" {
		o.Tolerations = append(o.Tolerations, corev1.Toleration{Key: in.tolKey, Value: in.tolValue, Operator: corev1.TolerationOperator(in.tolOp)})
		cp.Spec.DaemonSets.Tolerations = append(cp.Spec.DaemonSets.Tolerations, corev1.Toleration{Key: in.tolValue, Operator: corev1.TolerationOperator(in.tolOp)})
	}
	if in.selKey != "" {
		if o.NodeSelector == nil {
			o.NodeSelector = map[string]string{}
		}
		o.NodeSelector[in.selKey] = in.selValue
		if cp.Spec.DaemonSets.Labels == nil {
			cp.Spec.DaemonSets.Labels = map[string]string{}
		}
		cp.Spec.DaemonSets.Labels[in.selKey] = in.selValue // may collide with Loom's own labels
	}
	if in.resource != "" || in.replicas != 0 {
		if cp.Spec.DevicePlugin.Config == nil {
			cp.Spec.DevicePlugin.Config = &gpuv1alpha1.DevicePluginConfig{}
		}
		if cp.Spec.DevicePlugin.Config.TimeSlicing == nil {
			cp.Spec.DevicePlugin.Config.TimeSlicing = &gpuv1alpha1.TimeSlicingSpec{}
		}
		ts := cp.Spec.DevicePlugin.Config.TimeSlicing
		ts.Resources = append(ts.Resources, gpuv1alpha1.TimeSlicingResource{Name: in.resource, Replicas: in.replicas})
	}
	return cp
}

// FuzzDesired: for any policy, desired does not panic, and every child it
// wants is one of the policy's own (its name and namespace are those
// undesired knows, a namespaced one in Loom's namespace, a cluster-scoped
// one in none), typed, labelled with the policy, listed once, convertible
// by the writer, and the same on a second call; a DaemonSet's selector
// selects its own pods; the status of the pass does not panic either. A
// policy the API server and Validate accept gets only valid labels.
func FuzzDesired(f *testing.F) {
	rep, err := json.Marshal(representativePolicy().Spec)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("gpu-stack", "loom-system", rep, "", "", "", "", "", "", "", "", "", "", "", int32(0), uint16(0))
	f.Add("default", "loom-system", []byte(`{}`), "registry.example/nvidia", "driver", "570.172.08-ubuntu22.04", "A", "b",
		"nvidia.com/gpu", "", "Exists", "nvidia.com/gpu.product", "NVIDIA-H100", "nvidia.com/gpu", int32(4), uint16(0x5555))
	f.Add("x", "ns", []byte(`{"devicePlugin":{"config":{"configMapName":"c","defaultConfig":"a100"}},"mig":{"strategy":"mixed"}}`),
		"", "", "latest", "", "", "", "", "Bogus", "app.kubernetes.io/component", "mine", "nvidia.com/mig-1g.10gb", int32(-1), uint16(0xaaaa))
	f.Add("", "", []byte(`{"daemonsets":{"labels":{"gpu.loom.dev/clusterpolicy":"other"}}}`), ":", "/", ":", "", "", "", "", "", "", "", "", int32(1<<30), uint16(0xffff))
	f.Fuzz(func(t *testing.T, name, ns string, specJSON []byte, repo, image, version, envName, envValue, tolKey, tolValue, tolOp,
		selKey, selValue, resource string, replicas int32, flags uint16) {
		in := fuzzedPolicy{name: name, namespace: ns, specJSON: specJSON, repo: repo, image: image, version: version, envName: envName,
			envValue: envValue, tolKey: tolKey, tolValue: tolValue, tolOp: tolOp, selKey: selKey, selValue: selValue, resource: resource,
			replicas: replicas, flags: flags}
		cp := in.policy()
		p := desired(cp, ns, testFleet())
		want := p.objects
		checkChildren(t, cp, ns, p)
		if again := desired(cp, ns, testFleet()); apply.Hash(again.objects) != apply.Hash(want) {
			t.Fatal("desired is not a function of the policy: a second call differs")
		}
		if admitted(cp, ns) {
			checkLabels(t, want)
		}
		dss := map[string]*appsv1.DaemonSet{}
		for _, obj := range want {
			if ds, ok := obj.(*appsv1.DaemonSet); ok {
				dss[ds.Spec.Template.Labels[gpuv1alpha1.LabelComponent]] = ds
			}
		}
		st := status(cp, observed{active: cp.Name, gpuNodes: int32(flags), daemonSets: dss}, nil)
		if meta.FindStatusCondition(st.Conditions, conditionReady) == nil {
			t.Fatal("status without a Ready condition")
		}
	})
}

// checkChildren holds desired's invariants on want.
func checkChildren(t *testing.T, cp *gpuv1alpha1.ClusterPolicy, ns string, p plan) {
	t.Helper()
	want := p.objects
	// every child a policy can have, but the RuntimeClass
	own := undesired(ns, plan{}, dsNames(want))
	seen := map[string]bool{}
	for _, obj := range want {
		key := fmt.Sprintf("%s %s/%s", reflect.TypeOf(obj), obj.GetNamespace(), obj.GetName())
		if seen[key] {
			t.Fatalf("%s wanted twice", key)
		}
		seen[key] = true
		gvk := obj.GetObjectKind().GroupVersionKind()
		if gvk.Kind == "" || gvk.Version == "" || obj.GetName() == "" {
			t.Fatalf("%s: kind %v, name %q", key, gvk, obj.GetName())
		}
		if _, err := apply.ToUnstructured(obj); err != nil {
			t.Fatalf("%s: the writer cannot convert it: %v", key, err)
		}
		switch obj.(type) {
		case *nodev1.RuntimeClass:
			if obj.GetName() != RuntimeClassName || obj.GetNamespace() != "" {
				t.Fatalf("RuntimeClass %s", key)
			}
			continue
		case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			if obj.GetNamespace() != "" {
				t.Fatalf("cluster-scoped %s has a namespace", key)
			}
		default:
			if obj.GetNamespace() != ns {
				t.Fatalf("%s is not in Loom's namespace %q", key, ns)
			}
		}
		if !containsChild(own, obj) {
			t.Fatalf("%s is not one of the policy's children", key)
		}
		if obj.GetLabels()[gpuv1alpha1.LabelPolicy] != cp.Name || obj.GetLabels()[apply.LabelManagedBy] != apply.ManagedBy {
			t.Fatalf("%s labels %v, want the policy %q and Loom's", key, obj.GetLabels(), cp.Name)
		}
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			for k, v := range ds.Spec.Selector.MatchLabels {
				if ds.Spec.Template.Labels[k] != v {
					t.Fatalf("%s: its selector %v does not select its pods %v", key, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
				}
			}
		}
	}
	if left := undesired(ns, p, dsNames(want)); containsAny(left, want) {
		t.Fatal("undesired would remove a wanted child")
	}
}

func containsChild(objs []client.Object, obj client.Object) bool {
	for _, o := range objs {
		if sameChild(o, obj) {
			return true
		}
	}
	return false
}

func containsAny(objs, of []client.Object) bool {
	for _, o := range of {
		if containsChild(objs, o) {
			return true
		}
	}
	return false
}

// admitted approximates what the API server stores and Validate passes: a
// valid policy name and namespace and a spec without field errors.
func admitted(cp *gpuv1alpha1.ClusterPolicy, ns string) bool {
	return len(validation.IsDNS1123Subdomain(cp.Name)) == 0 && len(cp.Name) <= 63 &&
		len(validation.IsDNS1123Label(ns)) == 0 && len(cp.Spec.Validate()) == 0
}

// checkLabels: every label key and value of every child, and of every pod
// template, is one the API server accepts.
func checkLabels(t *testing.T, want []client.Object) {
	t.Helper()
	for _, obj := range want {
		sets := []map[string]string{obj.GetLabels()}
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			sets = append(sets, ds.Spec.Template.Labels, ds.Spec.Selector.MatchLabels)
		}
		for _, labels := range sets {
			for k, v := range labels {
				if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
					t.Fatalf("%s/%s: label %s=%s: %v", obj.GetNamespace(), obj.GetName(), k, v, errs)
				}
			}
		}
	}
}
