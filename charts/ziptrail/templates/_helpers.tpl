{{- define "ziptrail.name" -}}ziptrail{{- end -}}
{{- define "ziptrail.labels" -}}
app.kubernetes.io/name: ziptrail
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "ziptrail.selector" -}}
app.kubernetes.io/name: ziptrail
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}
{{- define "ziptrail.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{ printf "%s/%s:%s" .root.Values.image.registry .name $tag }}
{{- end -}}
{{- define "ziptrail.secretName" -}}{{ .Release.Name }}-tiers{{- end -}}
