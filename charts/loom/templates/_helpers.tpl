{{/* Chart name, truncated to fit label values. */}}
{{- define "loom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "loom.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "loom.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "loom.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
loom.shortName is the fullname and .suffix, the fullname cut so that the
whole is at most 63 characters: a Service's name is a DNS label, and a
Job's is its pods' job-name label.
*/}}
{{- define "loom.shortName" -}}
{{- printf "%s%s" (include "loom.fullname" .ctx | trunc (int (sub 63 (len .suffix))) | trimSuffix "-") .suffix }}
{{- end }}

{{/* The manager's metrics Service. */}}
{{- define "loom.metricsService" -}}
{{- include "loom.shortName" (dict "ctx" . "suffix" "-metrics") }}
{{- end }}

{{/* The app.kubernetes.io labels every object carries (plus a component). */}}
{{- define "loom.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "loom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: loom
{{- end }}

{{/*
loom.labelsWith is the chart's labels with component .component, and the
user's .extra over them: each key once, the user's value where both set it.
*/}}
{{- define "loom.labelsWith" -}}
{{- $labels := include "loom.labels" .ctx | fromYaml -}}
{{- $_ := set $labels "app.kubernetes.io/component" .component -}}
{{- toYaml (merge (dict) (.extra | default dict) $labels) -}}
{{- end -}}

{{/* Labels that select the manager's pods (immutable once installed). */}}
{{- define "loom.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end }}

{{- define "loom.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-manager" (include "loom.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image: repository:tag, tag defaulting to the chart's appVersion;
with a digest, repository@digest (repository:tag@digest when a tag is
given too: the runtime pulls by the digest).
*/}}
{{- define "loom.image" -}}
{{- $tag := .Values.image.tag | default (ternary "" .Chart.AppVersion (not (empty .Values.image.digest))) }}
{{- .Values.image.repository }}{{ with $tag }}:{{ . }}{{ end }}{{ with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/*
The rules controller-gen generated from the +kubebuilder:rbac markers
(files/rbac/role.yaml), by kind: ClusterRole or Role.
*/}}
{{- define "loom.generatedRules" -}}
{{- $kind := .kind }}
{{- $rules := list }}
{{- range $doc := splitList "\n---" (.ctx.Files.Get (default "files/rbac/role.yaml" .file)) }}
{{- $obj := fromYaml $doc }}
{{- if and $obj (eq (get $obj "kind") $kind) }}
{{- $rules = concat $rules (get $obj "rules") }}
{{- end }}
{{- end }}
{{- toYaml $rules }}
{{- end }}

{{- define "loom.agentServiceAccountName" -}}
{{- printf "%s-node-agent" (include "loom.fullname" .) }}
{{- end }}

{{- define "loom.agentSelectorLabels" -}}
app.kubernetes.io/name: {{ include "loom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end }}

{{/* loom.labelList renders a label map as key=value,key=value (sorted). */}}
{{- define "loom.labelList" -}}
{{- $out := list -}}
{{- range $k, $v := . -}}
{{- $out = append $out (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/*
loom.managerFlags are loom manager's flags that take a value and
loom.managerBoolFlags its booleans (--version left out: it exits), so that
manager.extraArgs are checked at install, not by a crash-looping manager. A
test holds them to the manager's.
*/}}
{{- define "loom.managerFlags" -}}
controllers gang-scheduler graceful-shutdown-timeout grafana-dashboards-namespace health-probe-bind-address kube-api-burst kube-api-qps kubeconfig kueue-label-keys-to-copy leader-election-id leader-election-lease-duration leader-election-namespace leader-election-renew-deadline leader-election-retry-period log-format log-level max-concurrent-reconciles max-workload-pods metrics-bind-address metrics-cert-dir metrics-scrape-interval metrics-service-monitor metrics-service-monitor-labels monitoring-labels namespace pprof-bind-address watch-namespaces
{{- end -}}
{{- define "loom.managerBoolFlags" -}}
apply-crds enable-http2 grafana-dashboards install-ray-crd kueue kueue-manage-jobs-without-queue-name leader-elect metrics-secure
{{- end -}}

{{/*
loom.chartFlags are the manager's flags the chart sets, and how to set each:
one in manager.extraArgs too would override the value that the chart's
objects (its RBAC, probes, ServiceMonitor) follow.
*/}}
{{- define "loom.chartFlags" -}}
controllers: set manager.controllers
watch-namespaces: set manager.watchNamespaces
leader-elect: set manager.leaderElection.enabled
leader-election-id: set manager.leaderElection.leaseName
leader-election-namespace: the Lease is in the release namespace, where the chart's Role lets the manager write it
namespace: the manager runs in the release namespace, where the chart's RBAC is
metrics-bind-address: set metrics.port
metrics-service-monitor: set metrics.serviceMonitor.enabled
metrics-scrape-interval: set metrics.serviceMonitor.interval
metrics-service-monitor-labels: set metrics.serviceMonitor.labels
health-probe-bind-address: the chart's probes read port 8081
kube-api-qps: set manager.kubeAPIQPS
kube-api-burst: set manager.kubeAPIBurst
max-concurrent-reconciles: set manager.maxConcurrentReconciles
gang-scheduler: set manager.gangScheduler
kueue: set manager.kueue
kueue-manage-jobs-without-queue-name: set manager.kueueManageJobsWithoutQueueName
kueue-label-keys-to-copy: set manager.kueueLabelKeysToCopy
max-workload-pods: set manager.maxWorkloadPods
install-ray-crd: set rayCluster.installCRD
apply-crds: set manager.applyCRDs
monitoring-labels: set monitoring.labels
grafana-dashboards: set monitoring.grafanaDashboards.enabled
grafana-dashboards-namespace: set monitoring.grafanaDashboards.namespace
log-level: set manager.logLevel
log-format: set manager.logFormat
{{- end -}}

{{/*
loom.checkExtraArgs fails unless manager.extraArgs are flags of loom
manager, as Go's flag package reads them (-name or --name, its value after
= or, for a flag that is no boolean, as the next argument), that the chart
does not set.
*/}}
{{- define "loom.checkExtraArgs" -}}
{{- $valued := splitList " " (include "loom.managerFlags" .) -}}
{{- $known := concat $valued (splitList " " (include "loom.managerBoolFlags" .)) -}}
{{- $chart := include "loom.chartFlags" . | fromYaml -}}
{{- $value := "" -}}
{{- range .Values.manager.extraArgs -}}
{{- if $value -}}
{{- $value = "" -}}
{{- else -}}
{{- $name := regexReplaceAll "^--?([^=]*).*$" . "${1}" -}}
{{- if or (not (hasPrefix "-" .)) (not (has $name $known)) -}}
{{- fail (printf "manager.extraArgs: %q is not a flag of loom manager (the README's Manager flags table names them; a boolean takes its value after =, --name=false)" .) -}}
{{- end -}}
{{- with get $chart $name -}}
{{- fail (printf "manager.extraArgs: --%s is the chart's: %s" $name .) -}}
{{- end -}}
{{- if and (not (contains "=" .)) (has $name $valued) -}}
{{- $value = . -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $value -}}
{{- fail (printf "manager.extraArgs ends with %s, which takes a value (--name=value)" .) -}}
{{- end -}}
{{- end -}}

{{/* loom.runs is "true" when manager.controllers runs controller .name. */}}
{{- define "loom.runs" -}}
{{- $controllers := splitList "," (nospace .ctx.Values.manager.controllers) -}}
{{- or (has "all" $controllers) (has "*" $controllers) (has .name $controllers) -}}
{{- end -}}

{{/*
loom.chartServiceMonitor is "true" when the chart renders the manager's
ServiceMonitor: enabled true, or auto where the manager writes none (its
monitoring controller left out of manager.controllers) and the CRD is
installed.
*/}}
{{- define "loom.chartServiceMonitor" -}}
{{- $enabled := toString .Values.metrics.serviceMonitor.enabled -}}
{{- $crd := .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor" -}}
{{- or (eq $enabled "true") (and (eq $enabled "auto") (ne (include "loom.runs" (dict "ctx" . "name" "monitoring")) "true") $crd) -}}
{{- end -}}

{{/*
loom.defaults fills in .Values the values of the chart's defaults
(files/values.yaml, make manifests' copy of values.yaml) it lacks: helm
upgrade --reuse-values renders with the old release's values in place of
values.yaml, without the values a newer chart added. A value set to null
(which helm removes) takes its default too, except a list (null: none, as
[]) and a key of resources or of a security context (null leaves it out):
those blocks are filled as a whole only. Every template calls it first.
*/}}
{{- define "loom.defaults" -}}
{{- include "loom.fill" (dict "values" .Values "defaults" (.Files.Get "files/values.yaml" | fromYaml)) -}}
{{- end -}}

{{- define "loom.fill" -}}
{{- $values := .values -}}
{{- range $key, $default := .defaults -}}
{{- $missing := or (not (hasKey $values $key)) (kindIs "invalid" (index $values $key)) -}}
{{- if and $missing (not (and (kindIs "slice" $default) $default)) -}}
{{- $_ := set $values $key $default -}}
{{- else if and (not $missing) (kindIs "map" $default) (kindIs "map" (index $values $key)) (not (has $key (list "resources" "podSecurityContext" "securityContext"))) -}}
{{- include "loom.fill" (dict "values" (index $values $key) "defaults" $default) -}}
{{- end -}}
{{- end -}}
{{- end -}}
