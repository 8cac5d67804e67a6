{{/* The prefix of every object's name: the release name, or <release>-keyroll when the release name does not contain "keyroll". */}}
{{- define "keyroll.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The manager's name: its Deployment, ServiceAccount (unless serviceAccount.name), RBAC, PodDisruptionBudget and NetworkPolicy. */}}
{{- define "keyroll.manager" -}}
{{- include "keyroll.fullname" . }}-manager
{{- end -}}

{{- define "keyroll.serviceAccountName" -}}
{{- default (include "keyroll.manager" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "keyroll.metricsReader" -}}
{{- include "keyroll.fullname" . }}-metrics-reader
{{- end -}}

{{/* Labels of every object. */}}
{{- define "keyroll.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: keyroll
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels that select the manager pods. */}}
{{- define "keyroll.selectorLabels" -}}
app.kubernetes.io/name: keyroll
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end -}}

{{- define "keyroll.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
