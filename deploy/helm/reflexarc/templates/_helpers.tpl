{{/* Name of the release's objects: the release name, or release-chart when they differ. */}}
{{- define "reflexarc.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "reflexarc.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "reflexarc.labels" -}}
{{ include "reflexarc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "reflexarc.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* The chart's etcd (fleet.etcd.deploy): its StatefulSet and client Service, and the headless Service its members are named in. */}}
{{- define "reflexarc.etcd.name" -}}
{{- printf "%s-etcd" (include "reflexarc.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "reflexarc.etcd.headless" -}}
{{- printf "%s-etcd-headless" (include "reflexarc.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Not the controller's name: the DaemonSet's and the metrics Service's selectors must not pick the etcd pods. */}}
{{- define "reflexarc.etcd.selectorLabels" -}}
app.kubernetes.io/name: etcd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: fleet-store
{{- end -}}

{{- define "reflexarc.etcd.labels" -}}
{{ include "reflexarc.etcd.selectorLabels" . }}
app.kubernetes.io/part-of: {{ .Chart.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The scheme the chart's etcd serves its clients and peers: https with fleet.etcd.tls.secretName. */}}
{{- define "reflexarc.etcd.scheme" -}}
{{- if .Values.fleet.etcd.tls.secretName -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{- define "reflexarc.etcd.image" -}}
{{- if .Values.fleet.etcd.image.digest -}}
{{ .Values.fleet.etcd.image.repository }}@{{ .Values.fleet.etcd.image.digest }}
{{- else -}}
{{ .Values.fleet.etcd.image.repository }}:{{ .Values.fleet.etcd.image.tag }}
{{- end -}}
{{- end -}}

{{/* Member i's DNS name: its pod in the headless Service. */}}
{{- define "reflexarc.etcd.host" -}}
{{- $ := index . 0 -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "reflexarc.etcd.name" $) (index . 1) (include "reflexarc.etcd.headless" $) $.Release.Namespace $.Values.fleet.etcd.clusterDomain -}}
{{- end -}}

{{/*
The controllers' --fleet-etcd: every member of the chart's etcd, or
fleet.endpoints; empty when the fleet is off. Fails on values that cannot
work together: both etcds, or a fleet setting without an etcd.
*/}}
{{- define "reflexarc.fleet.endpoints" -}}
{{- $fleet := .Values.fleet -}}
{{- if and $fleet.etcd.deploy $fleet.endpoints -}}
{{- fail "fleet.etcd.deploy=true runs the chart's own etcd, and fleet.endpoints names another: give one of them" -}}
{{- end -}}
{{- if and $fleet.etcd.tls.secretName (not $fleet.etcd.deploy) -}}
{{- fail "fleet.etcd.tls.secretName is the certificate of the chart's own etcd: set fleet.etcd.deploy=true, or give an existing etcd's https:// URLs as fleet.endpoints and the controllers' certificate as fleet.tls.secretName" -}}
{{- end -}}
{{- if and $fleet.etcd.deploy $fleet.etcd.tls.secretName (not $fleet.tls.secretName) -}}
{{- fail "fleet.etcd.tls.secretName makes the chart's etcd ask every client for a certificate: give the controllers one with fleet.tls.secretName (ca.crt, tls.crt, tls.key)" -}}
{{- end -}}
{{- if and $fleet.tls.secretName (not $fleet.endpoints) (not $fleet.etcd.tls.secretName) -}}
{{- fail "fleet.tls.secretName is for an etcd that serves https://: an existing one (fleet.endpoints), or the chart's own with fleet.etcd.tls.secretName; the chart's own etcd serves plain HTTP without it" -}}
{{- end -}}
{{- if $fleet.tls.secretName -}}
{{- range $fleet.endpoints -}}
{{- if not (hasPrefix "https://" .) -}}
{{- fail (printf "fleet.tls.secretName needs every fleet.endpoints URL as https://, got %s" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $fleet.etcd.deploy -}}
{{- $urls := list -}}
{{- range $i := until (int $fleet.etcd.replicas) -}}
{{- $urls = append $urls (printf "%s://%s:2379" (include "reflexarc.etcd.scheme" $) (include "reflexarc.etcd.host" (list $ $i))) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else if $fleet.endpoints -}}
{{- join "," $fleet.endpoints -}}
{{- else -}}
{{- range $key := list "maxNodes" "maxPercent" "ttl" "prefix" -}}
{{- if index $fleet $key -}}
{{- fail (printf "fleet.%s needs an etcd: set fleet.etcd.deploy=true (the chart runs one) or fleet.endpoints (an existing cluster's client URLs)" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
