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

{{/* The server's command line. The Python host takes the engine's options but not yet the
     router ones (aliases, vLLM names, the drain's grace), so those are refused with it. */}}
{{- define "torchtpu.command" -}}
{{- $s := .Values.server -}}
{{- $m := .Values.model -}}
{{- if eq .Values.launcher "cli" }}
- torchtpu-cpp
- serve
{{- else if eq .Values.launcher "python" }}
{{- if or $m.aliases $s.vllmMetricNames }}
{{- fail "model.aliases and server.vllmMetricNames need launcher: cli (python -m torchtpu_cpp.serve does not take them yet)" }}
{{- end }}
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
- --model-id={{ required "model.id is required" $m.id }}
- --context={{ $m.context }}
- --device={{ $m.device }}
- --dtype={{ $m.dtype }}
- --max-queue={{ $s.maxQueue }}
- --threads={{ $s.threads }}
{{- if eq .Values.launcher "cli" }}
{{- range $m.aliases }}
- --served-model-name={{ . }}
{{- end }}
- --drain-grace={{ $s.drainGraceSeconds }}
{{- if $s.vllmMetricNames }}
- --metrics-compat=vllm
{{- end }}
{{- end }}
{{- range $s.extraArgs }}
- {{ . }}
{{- end }}
{{- end -}}
