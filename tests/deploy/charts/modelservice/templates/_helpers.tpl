{{- /* The container of llm-d-modelservice's _helpers.tpl ("llm-d-modelservice.container" and its command
helpers): modelCommand vllmServe (command vllm serve, the model, --port, the parallelism) | imageDefault
(args only) | custom (the values' command and args); the values' env and volumeMounts, then extraConfig
(envFrom and any other container field), rendered as they are. */ -}}
{{- define "modelservice.container" -}}
- name: {{ default "vllm" .container.name }}
  image: {{ required "image of container is required" .container.image }}
  {{- $command := default "custom" .container.modelCommand }}
  {{- if eq $command "vllmServe" }}
  command: ["vllm", "serve"]
  args:
    - {{ .Values.modelArtifacts.name | quote }}
    - --port
    - {{ .Values.routing.proxy.targetPort | quote }}
    {{- if gt (int .parallelism.data) 1 }}
    - --data-parallel-size
    - {{ .parallelism.data | quote }}
    - --data-parallel-size-local
    - {{ .parallelism.dataLocal | quote }}
    {{- end }}
    {{- with .container.args }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- else if eq $command "imageDefault" }}
  args:
    - --model
    - {{ .Values.modelArtifacts.name | quote }}
    {{- with .container.args }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- else }}
  command: {{ toYaml (required "a custom modelCommand needs a command" .container.command) | nindent 4 }}
  {{- with .container.args }}
  args: {{ toYaml . | nindent 4 }}
  {{- end }}
  {{- end }}
  env:
    - name: DP_SIZE
      value: {{ .parallelism.data | quote }}
    - name: DP_SIZE_LOCAL
      value: {{ .parallelism.dataLocal | quote }}
    {{- with .container.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .container.extraConfig }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with .container.resources }}
  resources: {{ toYaml . | nindent 4 }}
  {{- end }}
  {{- with .container.volumeMounts }}
  volumeMounts: {{ toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{- define "modelservice.routingProxy" -}}
{{- if .Values.routing.proxy.enabled }}
- name: routing-proxy
  image: {{ .Values.routing.proxy.image }}
  args:
    - --port={{ .Values.routing.servicePort }}
    - --vllm-port={{ .Values.routing.proxy.targetPort }}
  ports:
    - containerPort: {{ .Values.routing.servicePort }}
  restartPolicy: Always
  securityContext:
    allowPrivilegeEscalation: false
    runAsNonRoot: true
{{- end }}
{{- end }}

{{- define "modelservice.podSpec" -}}
{{- if or .Values.decode.initContainers .Values.routing.proxy.enabled }}
initContainers:
  {{- include "modelservice.routingProxy" . | nindent 2 }}
  {{- with .Values.decode.initContainers }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
containers:
  {{- range .Values.decode.containers }}
  {{- include "modelservice.container" (dict "container" . "parallelism" $.Values.decode.parallelism "Values" $.Values) | nindent 2 }}
  {{- end }}
{{- with .Values.decode.volumes }}
volumes: {{ toYaml . | nindent 2 }}
{{- end }}
{{- end }}
