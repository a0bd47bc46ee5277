{{/* Names, labels and the pieces of the server container shared by the templates. */}}

{{- define "radixcluster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "radixcluster.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "radixcluster.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{ include "radixcluster.instanceLabels" . }}
{{- end }}

{{/* Every pod of this release; the NetworkPolicy lets them reach one another. */}}
{{- define "radixcluster.instanceLabels" -}}
app.kubernetes.io/name: {{ include "radixcluster.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "radixcluster.selectorLabels" -}}
{{ include "radixcluster.instanceLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{- define "radixcluster.gatewaySelectorLabels" -}}
{{ include "radixcluster.instanceLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The headless Service the gateway finds the replica pods through. */}}
{{- define "radixcluster.replicasServiceName" -}}
{{- printf "%s-replicas" (include "radixcluster.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "radixcluster.rayHeadSelectorLabels" -}}
{{ include "radixcluster.instanceLabels" . }}
app.kubernetes.io/component: ray-head
{{- end }}

{{- define "radixcluster.rayHeadName" -}}
{{- printf "%s-ray-head" (include "radixcluster.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "radixcluster.rayAddress" -}}
{{- printf "%s:%d" (include "radixcluster.rayHeadName" .) (int .Values.ray.headPort) }}
{{- end }}

{{- define "radixcluster.image" -}}
{{- $flavor := ternary "cuda" "cpu" .Values.gpu.enabled }}
{{- printf "%s:%s" .Values.image.repository (default (printf "%s-%s" .Chart.AppVersion $flavor) .Values.image.tag) }}
{{- end }}

{{/* The Secret holding the API key, or "" when the server runs without one. */}}
{{- define "radixcluster.apiKeySecret" -}}
{{- if .Values.apiKey.existingSecret }}
{{- .Values.apiKey.existingSecret }}
{{- else if .Values.apiKey.create }}
{{- include "radixcluster.fullname" . }}
{{- end }}
{{- end }}

{{/* The key the chart's own calls send from outside the pods (Prometheus scraping /metrics), as
a secretKeyRef: the API key, else the admin key (the server accepts it wherever the API key is);
"" when neither is set. */}}
{{- define "radixcluster.callerKeyRef" -}}
{{- $apiKeySecret := include "radixcluster.apiKeySecret" . }}
{{- if $apiKeySecret }}
name: {{ $apiKeySecret }}
key: {{ .Values.apiKey.secretKey }}
{{- else if .Values.adminApiKey.existingSecret }}
name: {{ .Values.adminApiKey.existingSecret }}
key: {{ .Values.adminApiKey.secretKey }}
{{- end }}
{{- end }}

{{/* The admin key's variable, from adminApiKey.existingSecret (never a flag: ps shows those). */}}
{{- define "radixcluster.adminApiKeyEnv" -}}
{{- if .Values.adminApiKey.existingSecret }}
- name: RADIXCLUSTER_ADMIN_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.adminApiKey.existingSecret }}
      key: {{ .Values.adminApiKey.secretKey }}
{{- end }}
{{- end }}

{{- define "radixcluster.tenantsDir" -}}
/etc/radixcluster/tenants
{{- end }}

{{/* The --api-key-file of the server and the gateway, or "" without tenants. Tenants' keys make
every call need a key, the chart's own too (the readiness check, the gateway's calls to the
replicas): they take the API key, else the admin key, and without either the chart refuses. */}}
{{- define "radixcluster.apiKeyFile" -}}
{{- if .Values.tenants.existingSecret }}
{{- if not (or (include "radixcluster.apiKeySecret" .) .Values.adminApiKey.existingSecret) }}
{{- fail "tenants.existingSecret needs a key for the chart's own calls (readiness, the gateway's calls to the replicas): keep apiKey.create=true, or set apiKey.existingSecret or adminApiKey.existingSecret" }}
{{- end }}
{{- printf "%s/%s" (include "radixcluster.tenantsDir" .) .Values.tenants.secretKey }}
{{- end }}
{{- end }}

{{/* The tenants' Secret as a volume (only its keys file) and its read-only mount. */}}
{{- define "radixcluster.tenantsVolume" -}}
{{- if .Values.tenants.existingSecret }}
- name: tenants
  secret:
    secretName: {{ .Values.tenants.existingSecret }}
    items:
      - key: {{ .Values.tenants.secretKey }}
        path: {{ .Values.tenants.secretKey }}
{{- end }}
{{- end }}

{{- define "radixcluster.tenantsMount" -}}
{{- if .Values.tenants.existingSecret }}
- name: tenants
  mountPath: {{ include "radixcluster.tenantsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "radixcluster.modelPath" -}}
{{- if ne .Values.model.source "embedded" }}
{{- trimSuffix "/" (printf "%s/%s" .Values.model.mountPath .Values.model.path) }}
{{- end }}
{{- end }}

{{/* The flags of `radixcluster up`; a null value leaves its flag to the server's default. The API
and admin keys are not among them: the server reads them from RADIXCLUSTER_API_KEY and
RADIXCLUSTER_ADMIN_API_KEY (a command line shows in ps). */}}
{{- define "radixcluster.serverArgs" -}}
{{- $s := .Values.server -}}
- --host=0.0.0.0
- --port={{ int $s.port }}
- --tp-size={{ int $s.tpSize }}
- --log-level={{ $s.logLevel }}
{{- with (include "radixcluster.modelPath" .) }}
- --model-path={{ . }}
{{- end }}
- --shutdown-timeout={{ $s.shutdownTimeout }}
{{- if .Values.ray.enabled }}
- --ray-address=$(RAY_ADDRESS)
{{- end }}
{{- $ints := dict "pageSize" "page-size" "chunkedPrefillSize" "chunked-prefill-size" "maxRunningRequests" "max-running-requests" "maxQueuedRequests" "max-queued-requests" "maxTotalTokens" "max-total-tokens" "contextLength" "context-length" }}
{{- range $key, $flag := $ints }}
{{- with index $s $key }}
- --{{ $flag }}={{ int64 . }}
{{- end }}
{{- end }}
{{- $strings := dict "servedModelName" "served-model-name" "memFractionStatic" "mem-fraction-static" "dtype" "dtype" "schedulePolicy" "schedule-policy" "stepTimeout" "step-timeout" }}
{{- range $key, $flag := $strings }}
{{- with index $s $key }}
- {{ printf "--%s=%v" $flag . | quote }}
{{- end }}
{{- end }}
{{- if not (kindIs "invalid" $s.maxWorkerRestarts) }}
{{- /* 0 is a value here (no restart in place), which `with` would skip */}}
- --max-worker-restarts={{ int64 $s.maxWorkerRestarts }}
{{- end }}
{{- if $s.disableRadixCache }}
- --disable-radix-cache
{{- end }}
{{- with (include "radixcluster.apiKeyFile" .) }}
- --api-key-file={{ . }}
{{- end }}
{{- if .Values.gateway.enabled }}
- --kv-events-address=tcp://0.0.0.0:{{ int .Values.gateway.eventsPort }}
{{- end }}
{{- range $s.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Readiness as an exec probe: httpGet cannot read the API key (else the admin key, which the
server accepts wherever the API key is) from a Secret. */}}
{{- define "radixcluster.readinessCommand" -}}
{{- $url := printf "http://127.0.0.1:%d%s" (int .Values.server.port) .Values.probes.readiness.path -}}
- python
- -c
- |
  import os, urllib.request as u
  key = os.environ.get("RADIXCLUSTER_API_KEY") or os.environ.get("RADIXCLUSTER_ADMIN_API_KEY")
  headers = {"Authorization": "Bearer " + key} if key else {}
  u.urlopen(u.Request({{ $url | quote }}, headers=headers), timeout={{ int .Values.probes.readiness.timeoutSeconds }})
{{- end }}

{{- define "radixcluster.rayTokenSecret" -}}
{{- printf "%s-ray-token" (include "radixcluster.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Every Ray process of the release: where the head is, and token auth (Ray runs code for
anyone who reaches it). */}}
{{- define "radixcluster.rayEnv" -}}
- name: RAY_ADDRESS
  value: {{ include "radixcluster.rayAddress" . | quote }}
- name: RAY_USAGE_STATS_ENABLED
  value: "0"
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "radixcluster.rayTokenSecret" . }}
      key: token
{{- end }}

{{- define "radixcluster.modelVolume" -}}
{{- if eq .Values.model.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required with model.source=pvc" .Values.model.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
- name: model
  hostPath:
    path: {{ required "model.hostPath.path is required with model.source=hostPath" .Values.model.hostPath.path }}
    type: Directory
{{- end }}
{{- end }}

{{/* A Secret value that is generated once and then kept across upgrades. */}}
{{- define "radixcluster.persistentSecretValue" -}}
{{- $ctx := index . 0 }}{{- $name := index . 1 }}{{- $key := index . 2 }}
{{- $previous := lookup "v1" "Secret" $ctx.Release.Namespace $name }}
{{- if and $previous (hasKey $previous.data $key) }}
{{- index $previous.data $key }}
{{- else }}
{{- randAlphaNum 40 | b64enc }}
{{- end }}
{{- end }}

{{- define "radixcluster.replicaSummary" -}}
{{- $replicas := ternary (printf "%v-%v (autoscaled)" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) (toString .Values.replicaCount) .Values.autoscaling.enabled }}
{{- printf "%s replica(s), tensor parallel %d on %s" $replicas (int .Values.server.tpSize) (ternary "GPUs" "CPUs" .Values.gpu.enabled) }}
{{- if .Values.ray.enabled }} in one Ray cluster{{ end }}
{{- if .Values.gateway.enabled }}, behind a {{ .Values.gateway.policy }} gateway{{ end }}
{{- end }}

{{/* The flags of `radixcluster gateway`. */}}
{{- define "radixcluster.gatewayArgs" -}}
{{- $g := .Values.gateway -}}
- --host=0.0.0.0
- --port={{ int .Values.server.port }}
- --discover={{ include "radixcluster.replicasServiceName" . }}.{{ .Release.Namespace }}.svc.cluster.local:{{ int .Values.server.port }}
- --policy={{ $g.policy }}
- --log-level={{ $g.logLevel }}
- --shutdown-timeout={{ .Values.server.shutdownTimeout }}
{{- with (include "radixcluster.modelPath" .) }}
- --model-path={{ . }}
{{- end }}
{{- with (include "radixcluster.apiKeyFile" .) }}
- --api-key-file={{ . }}
{{- end }}
{{- with $g.loadWeight }}
- {{ printf "--load-weight=%v" . | quote }}
{{- end }}
{{- with $g.minOverlap }}
- {{ printf "--min-overlap=%v" . | quote }}
{{- end }}
{{- range $g.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* The pod's grace period after SIGTERM, refused when it cannot hold the preStop sleep, the drain
and the teardown. */}}
{{- define "radixcluster.terminationGracePeriod" -}}
{{- $needed := add (int .Values.preStopSleepSeconds) (int (ceil .Values.server.shutdownTimeout)) 15 }}
{{- if lt (int .Values.terminationGracePeriodSeconds) (int $needed) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least preStopSleepSeconds + server.shutdownTimeout + 15 = %d" (int .Values.terminationGracePeriodSeconds) (int $needed)) }}
{{- end }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
