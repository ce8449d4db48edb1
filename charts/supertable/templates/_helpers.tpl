{{/* Names: <release>-supertable unless the release name already says it (or fullnameOverride). */}}
{{- define "supertable.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "supertable.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<component>, e.g. supertable-cache */}}
{{- define "supertable.componentName" -}}
{{- printf "%s-%s" (include "supertable.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "supertable.selectorLabels" -}}
app.kubernetes.io/name: {{ include "supertable.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "supertable.labels" -}}
{{ include "supertable.selectorLabels" . }}
app.kubernetes.io/part-of: supertable
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels for objects that belong to no one component (Secret, ConfigMaps, ServiceAccount). */}}
{{- define "supertable.commonLabels" -}}
app.kubernetes.io/name: {{ include "supertable.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: supertable
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* A project image: [registry/]repository:tag, the tag defaulting to image.tag, then the chart's appVersion. */}}
{{- define "supertable.image" -}}
{{- $tag := .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if .root.Values.image.registry -}}
{{- printf "%s/%s:%s" .root.Values.image.registry .image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "supertable.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "supertable.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "supertable.secretName" -}}
{{- include "supertable.fullname" . -}}
{{- end -}}

{{- define "supertable.authSecret" -}}
{{- .Values.auth.existingSecret | default (include "supertable.secretName" .) -}}
{{- end -}}

{{- define "supertable.s3Secret" -}}
{{- .Values.s3.existingSecret | default (include "supertable.secretName" .) -}}
{{- end -}}

{{- define "supertable.s3HasCredentials" -}}
{{- if or .Values.s3.existingSecret .Values.s3.accessKeyId .Values.dev.s3.enabled -}}true{{- end -}}
{{- end -}}

{{/* Where things are, dev dependencies in the cluster taking precedence over the external addresses. */}}
{{- define "supertable.kafkaBootstrap" -}}
{{- if .Values.dev.kafka.enabled -}}
{{- printf "%s:%d" (include "supertable.componentName" (dict "root" . "component" "kafka")) (int .Values.dev.kafka.port) -}}
{{- else -}}
{{- required "kafka.bootstrap is required (host:port[,host:port])" .Values.kafka.bootstrap -}}
{{- end -}}
{{- end -}}

{{- define "supertable.redisUrl" -}}
{{- if .Values.dev.redis.enabled -}}
{{- printf "redis://%s:%d/0" (include "supertable.componentName" (dict "root" . "component" "redis")) (int .Values.dev.redis.port) -}}
{{- else -}}
{{- required "redis.url is required (redis://host:port/db)" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{- define "supertable.s3Endpoint" -}}
{{- if .Values.dev.s3.enabled -}}
{{- printf "http://%s:%d" (include "supertable.componentName" (dict "root" . "component" "s3")) (int .Values.dev.s3.port) -}}
{{- else -}}
{{- .Values.s3.endpointUrl -}}
{{- end -}}
{{- end -}}

{{- define "supertable.queryUrl" -}}
{{- printf "http://%s:%d" (include "supertable.componentName" (dict "root" . "component" "query")) (int .Values.query.port) -}}
{{- end -}}

{{/* The cache tier's headless Service: the StatefulSet's serviceName and the query tier's --cache-dns. */}}
{{- define "supertable.cacheHeadless" -}}
{{- include "supertable.componentName" (dict "root" . "component" "cache") -}}
{{- end -}}

{{/* The S3 client's settings, read by botocore (boto3) in every service. */}}
{{- define "supertable.awsEnv" -}}
- name: AWS_DEFAULT_REGION
  valueFrom:
    configMapKeyRef:
      name: {{ include "supertable.fullname" . }}
      key: AWS_DEFAULT_REGION
{{- if include "supertable.s3Endpoint" . }}
- name: AWS_ENDPOINT_URL
  valueFrom:
    configMapKeyRef:
      name: {{ include "supertable.fullname" . }}
      key: AWS_ENDPOINT_URL
{{- end }}
{{- if include "supertable.s3HasCredentials" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "supertable.s3Secret" . }}
      key: {{ .Values.s3.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "supertable.s3Secret" . }}
      key: {{ .Values.s3.secretAccessKeyKey }}
{{- end }}
{{- end -}}

{{- define "supertable.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
fsGroup: {{ .uid }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "supertable.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* startup, liveness and readiness probes: HTTP on a named port, or a tcpSocket for dependencies. */}}
{{- define "supertable.httpProbes" -}}
startupProbe:
  httpGet: {path: {{ .live }}, port: {{ .port }}}
  periodSeconds: 2
  timeoutSeconds: 2
  failureThreshold: {{ .startupFailures | default 60 }}
livenessProbe:
  httpGet: {path: {{ .live }}, port: {{ .port }}}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet: {path: {{ .ready }}, port: {{ .port }}}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{- define "supertable.tcpProbes" -}}
startupProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 5
  failureThreshold: 2
{{- end -}}

{{/* Spread a component's pods over zones and nodes; antiAffinity soft|hard keeps two off one node. */}}
{{- define "supertable.placement" -}}
{{- $c := .values -}}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if eq $c.antiAffinity "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "supertable.selectorLabels" . | nindent 12 }}
{{- else if eq $c.antiAffinity "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "supertable.selectorLabels" . | nindent 14 }}
{{- end }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "supertable.selectorLabels" . | nindent 8 }}
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: {{ $c.spreadOverNodes | default "ScheduleAnyway" }}
    labelSelector:
      matchLabels:
        {{- include "supertable.selectorLabels" . | nindent 8 }}
{{- end -}}

{{- define "supertable.pdb" -}}
{{- $c := .values -}}
{{- if $c.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "supertable.componentName" . }}
  labels:
    {{- include "supertable.labels" . | nindent 4 }}
spec:
  {{- if hasKey $c.pdb "minAvailable" }}
  minAvailable: {{ $c.pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $c.pdb.maxUnavailable | default 1 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "supertable.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{- define "supertable.hpa" -}}
{{- $c := .values -}}
{{- if $c.autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "supertable.componentName" . }}
  labels:
    {{- include "supertable.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: {{ .targetApiVersion | default "apps/v1" }}
    kind: {{ .targetKind | default "Deployment" }}
    name: {{ include "supertable.componentName" . }}
  minReplicas: {{ $c.autoscaling.minReplicas }}
  maxReplicas: {{ $c.autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $c.autoscaling.targetCPUUtilizationPercentage }}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: {{ $c.autoscaling.scaleDownStabilizationSeconds }}
      policies:
        - type: Pods
          value: 1
          periodSeconds: 60
{{- end }}
{{- end -}}

{{- define "supertable.podAnnotations" -}}
checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
{{- with .values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}
