{{- define "gpuslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "gpuslice.labels" -}}
app.kubernetes.io/name: gpuslice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* kube-scheduler of the cluster's own version (v1.33.4 from "v1.33.4-eks-1234"), unless pinned. */}}
{{- define "gpuslice.kubeSchedulerImage" -}}
{{- $image := .Values.scheduler.kubeSchedulerImage -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{- $tag := $image.tag | default (printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch) -}}
{{ $image.repository }}:{{ $tag }}
{{- end -}}
