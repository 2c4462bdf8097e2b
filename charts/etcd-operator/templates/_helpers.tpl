{{/* Names and labels shared by every template. */}}

{{- define "etcd-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "etcd-operator.fullname" -}}
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

{{- define "etcd-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "etcd-operator.labels" -}}
helm.sh/chart: {{ include "etcd-operator.chart" . }}
app.kubernetes.io/name: {{ include "etcd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The etcd-operator Pods. */}}
{{- define "etcd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "etcd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: apiserver
{{- end }}

{{/* The backing etcd members. */}}
{{- define "etcd-operator.etcdSelectorLabels" -}}
app.kubernetes.io/name: {{ include "etcd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: backing-etcd
{{- end }}

{{- define "etcd-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "etcd-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "etcd-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "etcd-operator.leaseName" -}}
{{- default (include "etcd-operator.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* Object names. */}}
{{- define "etcd-operator.servingSecret" -}}
{{- printf "%s-serving-cert" (include "etcd-operator.fullname" .) }}
{{- end }}
{{- define "etcd-operator.etcdName" -}}
{{- printf "%s-etcd" (include "etcd-operator.fullname" .) }}
{{- end }}
{{- define "etcd-operator.etcdServerSecret" -}}
{{- printf "%s-etcd-server-tls" (include "etcd-operator.fullname" .) }}
{{- end }}
{{- define "etcd-operator.etcdClientSecret" -}}
{{- printf "%s-etcd-client-tls" (include "etcd-operator.fullname" .) }}
{{- end }}
{{- define "etcd-operator.caName" -}}
{{- printf "%s-ca" (include "etcd-operator.fullname" .) }}
{{- end }}

{{/* DNS names of the API Service (the aggregator dials <service>.<namespace>.svc). */}}
{{- define "etcd-operator.servingDNSNames" -}}
{{- $svc := include "etcd-operator.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/* DNS names of the backing etcd members (each member and the headless Service). */}}
{{- define "etcd-operator.etcdDNSNames" -}}
{{- $svc := include "etcd-operator.etcdName" . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list "localhost" $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "*.%s.%s.svc" $svc $ns) (printf "*.%s.%s.svc.cluster.local" $svc $ns) -}}
{{- $names | toJson }}
{{- end }}

{{/* The backing etcd client URLs the server connects to. */}}
{{- define "etcd-operator.etcdServers" -}}
{{- if eq .Values.etcd.mode "external" }}
{{- if not .Values.etcd.external.endpoints }}
{{- fail "etcd.external.endpoints must list the external etcd's client URLs when etcd.mode is external" }}
{{- end }}
{{- join "," .Values.etcd.external.endpoints }}
{{- else }}
{{- $svc := include "etcd-operator.etcdName" . -}}
{{- $urls := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $urls = append $urls (printf "https://%s-%d.%s.%s.svc:2379" $svc $i $svc $.Release.Namespace) }}
{{- end }}
{{- join "," $urls }}
{{- end }}
{{- end }}

{{/* Fails on value combinations that cannot work. */}}
{{- define "etcd-operator.validate" -}}
{{- if not (has .Values.etcd.mode (list "internal" "external")) }}
{{- fail (printf "etcd.mode must be internal or external, not %q" .Values.etcd.mode) }}
{{- end }}
{{- if and (eq .Values.etcd.mode "internal") (not (has (int .Values.etcd.replicas) (list 1 3))) }}
{{- fail (printf "etcd.replicas must be 1 or 3, not %v" .Values.etcd.replicas) }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled: only one controller may act at a time" }}
{{- end }}
{{- if or (lt (int .Values.shards) 1) (gt (int .Values.shards) 1024) }}
{{- fail (printf "shards must be between 1 and 1024, not %v" .Values.shards) }}
{{- end }}
{{- if and (gt (int .Values.shards) 1) (not .Values.leaderElection.enabled) }}
{{- fail "shards > 1 needs leaderElection.enabled: the shards are held through Leases" }}
{{- end }}
{{- end }}

{{/*
The rules of the member objects the controller's Kubernetes runtime writes: cluster-wide in
the ClusterRole, or in a Role per namespace of watchNamespaces.
*/}}
{{- define "etcd-operator.memberRules" -}}
- apiGroups: [""]
  resources: ["pods", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch", "delete", "deletecollection"]
# Pods, Services and PodDisruptionBudgets are written with server-side apply (patch), which
# creates them when missing: create is granted with patch.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch", "delete"]
# Secrets: backup credentials and `secretRef` TLS are read; `auto` TLS CAs are created once
# (never replaced), member certificates applied (server-side apply), the clusters' watched
# (only those labelled etcd.operator.dev/cluster) for their expiry, and a removed member's
# deleted.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch", "deletecollection"]
# cert-manager Certificates of `certManager` TLS (server-side apply), removed with their member.
- apiGroups: ["cert-manager.io"]
  resources: ["certificates"]
  verbs: ["create", "patch", "deletecollection"]
{{- end }}
