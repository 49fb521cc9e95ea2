{{/*
Chart name, truncated to the 63 characters DNS labels allow.
*/}}
{{- define "streamjoin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name. Truncated so that suffixes like "-coordinator" and a
StatefulSet's pod ordinal still fit in 63 characters.
*/}}
{{- define "streamjoin.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "streamjoin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "streamjoin.labels" -}}
helm.sh/chart: {{ include "streamjoin.chart" . }}
{{ include "streamjoin.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: streamjoin
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels (without component).
*/}}
{{- define "streamjoin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "streamjoin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels and selector labels of one component: include with (dict "ctx" $ "component" "worker").
*/}}
{{- define "streamjoin.componentLabels" -}}
{{ include "streamjoin.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "streamjoin.componentSelectorLabels" -}}
{{ include "streamjoin.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "streamjoin.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "streamjoin.sparkImage" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.sparkTag | default .Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "streamjoin.bootstrap" -}}
{{- required "kafka.bootstrap is required: the Kafka bootstrap servers, e.g. my-kafka:9092" .Values.kafka.bootstrap }}
{{- end }}

{{/*
The streamjoin job name (JobSettings.job), used for the Prometheus `job` label.
*/}}
{{- define "streamjoin.jobName" -}}
{{- .Values.job.job | default "demo" }}
{{- end }}

{{/*
"true" when the job runs in SplitJoin mode (join.mode: splitjoin): the worker
StatefulSet's pods are its cores and a merger runs instead of a coordinator.
*/}}
{{- define "streamjoin.splitjoin" -}}
{{- if eq (dig "join" "mode" "hash" .Values.job) "splitjoin" }}true{{ end }}
{{- end }}

{{/*
The job's splitjoin.cores and splitjoin.max_cores, with the defaults of
settings/job.py SplitJoinSpec (test_deploy checks they agree): the chart needs
them to size the StatefulSet before any service has loaded the job.
*/}}
{{- define "streamjoin.splitjoinCores" -}}
{{- dig "splitjoin" "cores" 2 .Values.job | int }}
{{- end }}

{{- define "streamjoin.splitjoinMaxCores" -}}
{{- dig "splitjoin" "max_cores" 16 .Values.job | int }}
{{- end }}

{{/*
Worker pods (StatefulSet replicas). worker.replicas when set; otherwise the
job's initial k in SplitJoin mode (one pod per core), else 2.
*/}}
{{- define "streamjoin.workerReplicas" -}}
{{- $default := ternary (include "streamjoin.splitjoinCores" .) "2" (eq (include "streamjoin.splitjoin" .) "true") }}
{{- .Values.worker.replicas | default $default | int }}
{{- end }}

{{/*
Fails the render for a SplitJoin deployment that cannot work: a core's
position (its pod ordinal) must be below splitjoin.max_cores (the core topics'
partition count, where the CLI refuses --core), and the ordinal comes from the
pod-index label, which Kubernetes sets from 1.28 on.
*/}}
{{- define "streamjoin.checkSplitjoin" -}}
{{- if include "streamjoin.splitjoin" . }}
{{- $replicas := include "streamjoin.workerReplicas" . | int }}
{{- $max := include "streamjoin.splitjoinMaxCores" . | int }}
{{- if gt $replicas $max }}
{{- fail (printf "splitjoin mode: worker.replicas (%d) is above job.splitjoin.max_cores (%d): pod N runs core N, and cores are 0..max_cores-1" $replicas $max) }}
{{- end }}
{{- if semverCompare "<1.28.0-0" .Capabilities.KubeVersion.Version }}
{{- fail (printf "splitjoin mode needs Kubernetes >= 1.28 (the apps.kubernetes.io/pod-index label gives each core its --core), this is %s" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The nodeSelector of pods that join (the workers, and the query service, whose
operators run in its pod): `selector` (the component's nodeSelector, named
`field` in errors) plus, when `region` is set, topology.kubernetes.io/zone:
<region> (values.yaml says why the zone is pinned, not read). Include with
(dict "ctx" $ "selector" .Values.worker.nodeSelector "field" "worker.nodeSelector").
Fails on a selector that names another zone, and on a region outside
job.queries.regions when the job lists them.
*/}}
{{- define "streamjoin.zoneNodeSelector" -}}
{{- $selector := deepCopy (default (dict) .selector) }}
{{- with .ctx.Values.region }}
{{- $zone := "topology.kubernetes.io/zone" }}
{{- if and (hasKey $selector $zone) (ne (get $selector $zone) .) }}
{{- fail (printf "region %q and %s's %s %q disagree: set one of them" . $.field $zone (get $selector $zone)) }}
{{- end }}
{{- $regions := dig "queries" "regions" (list) $.ctx.Values.job }}
{{- if and $regions (not (has . $regions)) }}
{{- fail (printf "region %q is not among job.queries.regions %v: the query service would place no operator on these workers" . $regions) }}
{{- end }}
{{- $_ := set $selector $zone . }}
{{- end }}
{{- with $selector }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
job.yaml: the user's job spec plus the fields the chart owns. The coordinator's
expected_workers comes from worker.replicas through its environment instead,
so scaling the workers does not change job.yaml and roll every worker.
*/}}
{{- define "streamjoin.jobYaml" -}}
{{- $job := deepCopy .Values.job }}
{{- $_ := set $job "bootstrap" (include "streamjoin.bootstrap" .) }}
{{- $worker := deepCopy (default (dict) $job.worker) }}
{{- $_ = set $worker "state_dir" .Values.worker.stateDir }}
{{- $_ = set $worker "metrics_port" (int .Values.metrics.port) }}
{{- $_ = set $job "worker" $worker }}
{{- $coordinator := deepCopy (default (dict) $job.coordinator) }}
{{- $_ = set $coordinator "metrics_port" (int .Values.metrics.port) }}
{{- $_ = set $job "coordinator" $coordinator }}
{{- with .Values.kafka.client }}
{{- $_ = set $job "kafka" . }}
{{- end }}
{{- toYaml $job }}
{{- end }}

{{/*
Pod annotations for Prometheus' annotation-based discovery.
*/}}
{{- define "streamjoin.scrapeAnnotations" -}}
{{- if .Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/*
Pod-level settings shared by every pod.
*/}}
{{- define "streamjoin.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.serviceAccountName }}
serviceAccountName: {{ .Values.serviceAccountName }}
{{- end }}
automountServiceAccountToken: false
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Environment shared by every container.
*/}}
{{- define "streamjoin.env" -}}
- name: KAFKA_BOOTSTRAP
  value: {{ include "streamjoin.bootstrap" . | quote }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- include "streamjoin.kafkaSecretEnv" . }}
{{- end }}

{{/*
Kafka client secrets by secretKeyRef: kafka.secret.env maps a librdkafka
property to a key of the Secret; the settings read STREAMJOIN_KAFKA__<PROPERTY>.
*/}}
{{- define "streamjoin.kafkaSecretEnv" -}}
{{- $secret := .Values.kafka.secret }}
{{- if and $secret.name $secret.env }}
{{- range $property, $key := $secret.env }}
- name: STREAMJOIN_KAFKA__{{ $property | upper | replace "." "_" }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret.name }}
      key: {{ $key | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The Kafka client Secret as files: a container's volumeMounts entry and the
pod's volumes entry (both empty without kafka.secret.name and mountPath).
*/}}
{{- define "streamjoin.kafkaSecretMount" -}}
{{- if and .Values.kafka.secret.name .Values.kafka.secret.mountPath }}
- name: kafka-secret
  mountPath: {{ .Values.kafka.secret.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "streamjoin.kafkaSecretVolume" -}}
{{- if and .Values.kafka.secret.name .Values.kafka.secret.mountPath }}
- name: kafka-secret
  secret:
    secretName: {{ .Values.kafka.secret.name }}
    # 0440: the pods run as a non-root user in the fsGroup, which owns the files.
    defaultMode: 0440
{{- end }}
{{- end }}

{{/*
/healthz probes on the metrics port.
*/}}
{{- define "streamjoin.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .Values.probes.startup | nindent 2 }}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end }}
