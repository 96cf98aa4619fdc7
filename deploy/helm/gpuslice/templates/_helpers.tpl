{{- define "gpuslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Where pods reach the API server when no kube-proxy serves the kubernetes Service (kube-proxy-free
     networking, or a node without it): the in-cluster client reads these two, and a container's own
     variables win over the ones the kubelet injects. Empty: the kubelet's, as usual. */}}
{{- define "gpuslice.apiServerEnv" -}}
{{- with .Values.kubernetesService.host -}}
- {name: KUBERNETES_SERVICE_HOST, value: {{ . | quote }}}
- {name: KUBERNETES_SERVICE_PORT, value: {{ required "kubernetesService.port is needed with its host" $.Values.kubernetesService.port | quote }}}
{{- end -}}
{{- end -}}

{{/* podAnnotations as a JSON object of strings: `--set podAnnotations.x=2` gives a number, which
     the API server refuses as an annotation. */}}
{{- define "gpuslice.podAnnotations" -}}
{{- $out := dict -}}
{{- range $key, $value := .Values.podAnnotations }}{{ $_ := set $out $key (toString $value) }}{{ end -}}
{{- toJson $out -}}
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
