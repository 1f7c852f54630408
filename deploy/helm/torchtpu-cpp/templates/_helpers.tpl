{{- define "torchtpu.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "torchtpu.selectorLabels" -}}
app.kubernetes.io/name: torchtpu-cpp
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "torchtpu.labels" -}}
{{ include "torchtpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The server's command line: the CLI and the Python host take the same options. */}}
{{- define "torchtpu.command" -}}
{{- $s := .Values.server -}}
{{- $m := .Values.model -}}
{{- if eq .Values.launcher "cli" }}
- torchtpu-cpp
- serve
{{- else if eq .Values.launcher "python" }}
- python3
- -m
- torchtpu_cpp.serve
{{- else }}
{{- fail (printf "launcher must be cli or python, got %q" .Values.launcher) }}
{{- end }}
- --host=0.0.0.0
- --port={{ $s.port }}
{{- with $m.dir }}
- --model={{ . }}
{{- end }}
{{- with $m.emb4 }}
- --emb4={{ . }}
{{- end }}
- --model-id={{ required "model.id is required" $m.id }}
- --context={{ $m.context }}
- --device={{ $m.device }}
- --dtype={{ $m.dtype }}
- --parallel={{ $s.parallel }}
- --max-queue={{ $s.maxQueue }}
- --cache-mb={{ $s.cacheMb }}
- --threads={{ $s.threads }}
- --step-tokens={{ $s.stepTokens }}
- --pass-rows={{ $s.passRows }}
- --int4-activation-bits={{ $s.int4ActivationBits }}
{{- if $s.constrainTools }}
- --constrain-tools
{{- end }}
{{- range $m.aliases }}
- --served-model-name={{ . }}
{{- end }}
{{- range $m.lora }}
- --lora={{ required "model.lora[].name is required" .name }}={{ required "model.lora[].dir is required" .dir }}
{{- end }}
{{- if $m.runtimeLora }}
- --runtime-lora
- --max-loras={{ $m.maxLoras }}
{{- end }}
- --drain-grace={{ $s.drainGraceSeconds }}
{{- if $s.vllmMetricNames }}
- --metrics-compat=vllm
{{- end }}
{{- range $s.extraArgs }}
- {{ . }}
{{- end }}
{{- end -}}
