// Package preflight asks the API server whether it admits a workload's
// pods before any of them, or any other child of the workload, is made: a
// server-side dry-run create of one pod built from each pod template. What
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
// Answers are kept per namespace and pod shape: the pod's labels,
// annotations and spec with its owner's name taken out (the owner's name
// reaches labels, env values and hostnames), so that many workloads of
// one template cost one dry run. Names are not part of it: the controllers
// check them, and the dry run asks for a generated one.
package preflight

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// answer is the API server's word on a pod shape: the causes it refused
// it for, none when it admitted it or said nothing that counts.
type answer struct {
	causes []string
	at     time.Time
}

var (
	answers = lru.New(size)
	asking  singleflight.Group

	dryRuns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loom_preflight_dry_runs_total",
		Help: "Dry-run pod creates asked of the API server before a workload's pods are made, by result (admitted, invalid, unknown).",
	}, []string{"result"})
)

func init() { ctrlmetrics.Registry.MustRegister(dryRuns) }

// Refused says why the API server refuses pod, built for the object named
// owner, as invalid: its causes, each "<path>.<field>: <message>", joined
// by "; " (path is where the pod's template is in the owner's spec); ""
// when it admits the pod or cannot say. A pod of the same shape in the
// same namespace was asked about already: its answer is the pod's.
func Refused(ctx context.Context, c client.Client, owner, path string, pod *corev1.Pod) string {
	k := key(owner, pod)
	a, ok := answers.Get(k)
	if !ok || time.Since(a.(answer).at) > ttl {
		a, _, _ = asking.Do(k, func() (any, error) {
			a := answer{causes: dryRun(ctx, c, pod), at: time.Now()}
			if ctx.Err() == nil { // a cancelled pass's answer is no answer
				answers.Add(k, a)
			}
			return a, nil
		})
	}
	causes := a.(answer).causes
	out := make([]string, 0, min(len(causes), most)+1)
	for _, cause := range causes[:min(len(causes), most)] {
		out = append(out, path+"."+cause)
	}
	if len(causes) > most {
		out = append(out, fmt.Sprintf("and %d more", len(causes)-most))
	}
	return strings.Join(out, "; ")
}

// dryRun creates pod with dry run, under a generated name (a pod of its
// name may exist), and returns the causes of an Invalid answer.
func dryRun(ctx context.Context, c client.Client, pod *corev1.Pod) []string {
	p := pod.DeepCopy()
	if p.Name != "" {
		p.GenerateName, p.Name = p.Name+"-", ""
	}
	p.ResourceVersion = ""
	err := c.Create(ctx, p, client.DryRunAll)
	var status apierrors.APIStatus
	switch {
	case err == nil:
		dryRuns.WithLabelValues("admitted").Inc()
		return nil
	case !apierrors.IsInvalid(err) || !errors.As(err, &status):
		dryRuns.WithLabelValues("unknown").Inc()
		log.FromContext(ctx).V(1).Info("a dry run of the pod says nothing of its spec; proceeding", "error", err.Error())
		return nil
	}
	dryRuns.WithLabelValues("invalid").Inc()
	var causes []string
	if d := status.Status().Details; d != nil {
		for _, c := range d.Causes {
			causes = append(causes, c.Field+": "+c.Message)
		}
	}
	if len(causes) == 0 {
		causes = []string{"spec: " + status.Status().Message}
	}
	return causes
}

// key is a pod's namespace and shape: a hash of its labels, annotations
// and spec with owner's name replaced wherever it appears, beside the
// name's length (what the API server holds names to).
func key(owner string, pod *corev1.Pod) string {
	b, _ := json.Marshal([]any{pod.Labels, pod.Annotations, pod.Spec})
	s := string(b)
	if owner != "" {
		s = strings.ReplaceAll(s, owner, "\x00") // never in JSON text
	}
	sum := sha256.Sum256([]byte(s))
	return pod.Namespace + "/" + strconv.Itoa(len(owner)) + "/" + hex.EncodeToString(sum[:])
}
