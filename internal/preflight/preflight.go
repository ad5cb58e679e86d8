// Package preflight asks the API server whether it admits a workload's
// pods and the children built from what its user wrote (a RayCluster's
// head Service) before any of them, or any other child of the workload,
// is made: a server-side dry-run create of one pod built from each pod
// template, and of each such child. What
// the controllers check themselves (template metadata, tolerations,
// affinity) is only part of what the API server refuses in a pod: an env
// var name, two containers of one name, a port past 65535, requests above
// limits, a volume, a securityContext value. Without this check the first
// pods of a gang were made and the rest refused one by one.
//
// Only a refusal as invalid (422) says the template is wrong. Anything else
// (a quota or Pod Security refusal, a webhook that refuses dry runs, a
// timeout) says nothing, and the workload proceeds as it would have.
//
// The dry run is the create the controller will make, owner references
// included (an admission policy may read them), under a generated name (an
// object of its own name may exist); nothing of it persists. The API
// server's answer names the object by the name the controller gives it,
// not by the dry run's generated one, nor by a UID only the dry run had.
//
// Answers are kept per namespace, kind and shape: the object with its
// name, its owners' UIDs and owner's name taken out (the owner's name
// reaches labels, env values and hostnames), so that many workloads of
// one template cost one dry run. Names are not part of it: the controllers
// check them. An answer that names its owner is asked again for another.
package preflight

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

const (
	// size bounds the answers kept (a few hundred bytes each).
	size = 4096
	// ttl is how long an answer is kept: an upgraded API server, or a
	// namespace's admission changed, is asked again.
	ttl = 10 * time.Minute
	// most is how many of the API server's causes are quoted.
	most = 5
)

// answer is the API server's word on a shape, asked for owner: the
// causes it refused it for, none when it admitted it or said nothing that
// counts.
type answer struct {
	causes []string
	owner  string
	at     time.Time
}

// fits reports whether the answer is still good for owner: not too old,
// and asked for owner or naming none (an answer that quotes its owner's
// name, in a label or a hostname, is not another owner's).
func (a answer) fits(owner string) bool {
	if time.Since(a.at) > ttl {
		return false
	}
	return a.owner == owner || a.owner == "" || !strings.Contains(strings.Join(a.causes, "\n"), a.owner)
}

var (
	answers = lru.New(size)
	asking  singleflight.Group

	dryRuns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loom_preflight_dry_runs_total",
		Help: "Dry-run creates (pods, a RayCluster's head Service) asked of the API server before a workload's children are made, by result (admitted, invalid, unknown).",
	}, []string{"result"})
)

func init() { ctrlmetrics.Registry.MustRegister(dryRuns) }

// Refused says why the API server refuses obj (a Pod, a Service), built
// for the object named owner, as invalid: its causes, each
// "<path>.<field>: <message>" ("<field>: <message>" when path is ""),
// joined by "; " (path is where what obj is built from is in the owner's
// spec); "" when it admits obj or cannot say. An object of the same kind
// and shape in the same namespace was asked about already: its answer is
// obj's.
func Refused(ctx context.Context, c client.Client, owner, path string, obj client.Object) string {
	o, k := shape(owner, obj)
	a, ok := answers.Get(k)
	if !ok || !a.(answer).fits(owner) {
		a, _, _ = asking.Do(k+"\x00"+owner, func() (any, error) {
			a := answer{causes: dryRun(ctx, c, o, obj), owner: owner, at: time.Now()}
			if ctx.Err() == nil { // a cancelled pass's answer is no answer
				answers.Add(k, a)
			}
			return a, nil
		})
	}
	return quote(path, a.(answer).causes)
}

// Known is Refused without asking: the answer kept for obj's shape (a
// dry run's, or a refused write's: Record), "" when none is. It is for an
// object that exists already, which a create, even a dry one, would meet.
func Known(owner, path string, obj client.Object) string {
	_, k := shape(owner, obj)
	a, ok := answers.Get(k)
	if !ok || !a.(answer).fits(owner) {
		return ""
	}
	return quote(path, a.(answer).causes)
}

// Record keeps err, the API server's answer to a real create or apply of
// obj built for owner, as the answer for obj's shape when it refuses obj
// as invalid: a dry run does not check everything (a nodePort outside the
// server's range, which only the allocation checks), nor an update of an
// object that exists.
func Record(owner string, obj client.Object, err error) {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return
	}
	_, k := shape(owner, obj)
	answers.Add(k, answer{causes: causes(status, obj, obj), owner: owner, at: time.Now()})
}

// shape is a copy of obj to create (nameless, under a generated name,
// with its owner references) and the key of its answers (its owners' UIDs
// taken out).
func shape(owner string, obj client.Object) (client.Object, string) {
	o := obj.DeepCopyObject().(client.Object)
	gen := o.GetGenerateName()
	if name := o.GetName(); name != "" {
		gen = name + "-" // an object of its name may exist
	}
	o.SetName("")
	o.SetGenerateName("")
	o.SetResourceVersion("")
	refs := o.GetOwnerReferences()
	anon := make([]metav1.OwnerReference, len(refs))
	for i, ref := range refs {
		ref.UID = ""
		anon[i] = ref
	}
	o.SetOwnerReferences(anon)
	k := key(owner, o)
	o.SetOwnerReferences(refs)
	o.SetGenerateName(gen)
	return o, k
}

// quote is the causes under path, the first few.
func quote(path string, causes []string) string {
	if path != "" {
		path += "."
	}
	out := make([]string, 0, min(len(causes), most)+1)
	for _, cause := range causes[:min(len(causes), most)] {
		out = append(out, path+cause)
	}
	if len(causes) > most {
		out = append(out, fmt.Sprintf("and %d more", len(causes)-most))
	}
	return strings.Join(out, "; ")
}

// dryRun creates obj (under a generated name) with dry run and returns
// the causes of an Invalid answer, naming the object as the controller
// does (as): not by the dry run's name, nor by a UID only it had.
func dryRun(ctx context.Context, c client.Client, obj, as client.Object) []string {
	err := c.Create(ctx, obj, client.DryRunAll)
	var status apierrors.APIStatus
	switch {
	case err == nil:
		dryRuns.WithLabelValues("admitted").Inc()
		return nil
	case !apierrors.IsInvalid(err) || !errors.As(err, &status):
		dryRuns.WithLabelValues("unknown").Inc()
		log.FromContext(ctx).V(1).Info("a dry run says nothing of what the workload asks; proceeding", "kind", fmt.Sprintf("%T", obj), "error", err.Error())
		return nil
	}
	dryRuns.WithLabelValues("invalid").Inc()
	return causes(status, obj, as)
}

// causes are the fields an Invalid answer to a create of sent names, each
// with its message; a cause that names none (an admission policy's) is
// the spec's. The name the API server gave sent (a generated one) is
// as's, and a UID sent did not carry (the one the API server gave it) is
// said as <uid>: neither is the object's that will be made.
func causes(status apierrors.APIStatus, sent, as client.Object) []string {
	var out []string
	d := status.Status().Details
	if d != nil {
		for _, c := range d.Causes {
			if c.Field == "" {
				c.Field = "spec"
			}
			out = append(out, c.Field+": "+c.Message)
		}
	}
	if len(out) == 0 {
		out = []string{"spec: " + status.Status().Message}
	}
	name := as.GetName()
	if name == "" {
		name = as.GetGenerateName() + "<random>"
	}
	gen := sent.GetGenerateName()
	generated := d != nil && gen != "" && len(d.Name) > len(gen) && strings.HasPrefix(d.Name, gen)
	b, _ := json.Marshal(sent)
	for i, s := range out {
		if generated {
			s = strings.ReplaceAll(s, d.Name, name)
		}
		out[i] = uids.ReplaceAllStringFunc(s, func(u string) string {
			if bytes.Contains(b, []byte(u)) {
				return u
			}
			return "<uid>"
		})
	}
	return out
}

// uids matches a UID as the API server makes them.
var uids = regexp.MustCompile(`\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)

// key is an object's namespace, kind and shape: a hash of obj (nameless,
// its owners' UIDs taken out) with owner's name replaced wherever it
// appears, beside the name's length (what the API server holds names to).
func key(owner string, obj client.Object) string {
	b, _ := json.Marshal(obj)
	s := string(b)
	if owner != "" {
		s = strings.ReplaceAll(s, owner, "\x00") // never in JSON text
	}
	sum := sha256.Sum256([]byte(s))
	return fmt.Sprintf("%s/%T/%d/%s", obj.GetNamespace(), obj, len(owner), hex.EncodeToString(sum[:]))
}
