{{/* The release's full name, at most 63 characters. */}}
{{- define "briq-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "briq-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "briq-operator.labels" -}}
{{ include "briq-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "briq-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "briq-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "briq-operator.leaseName" -}}
{{- default (include "briq-operator.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/* The aggregated API's Service (the APIService names it) and its serving certificate's Secret. */}}
{{- define "briq-operator.subresourcesService" -}}
{{- printf "%s-subresources" (include "briq-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "briq-operator.subresourcesSecret" -}}
{{- printf "%s-subresources-tls" (include "briq-operator.fullname" .) -}}
{{- end -}}
