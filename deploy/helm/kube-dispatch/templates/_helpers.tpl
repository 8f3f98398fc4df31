{{/*
The labels of every object: the one kustomize's base gives them (app.kubernetes.io/part-of),
and Helm's.
*/}}
{{- define "kube-dispatch.labels" -}}
app.kubernetes.io/part-of: kube-dispatch
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}
