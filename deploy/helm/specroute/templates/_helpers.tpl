{{/* The labels every object carries: deploy/k8s's part-of, and Helm's own. */}}
{{- define "specroute.labels" -}}
app.kubernetes.io/part-of: specroute
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Whether the chart runs a route's server: not when it names a url or a service. */}}
{{- define "specroute.served" -}}
{{- if not (or .url .service) }}true{{ end }}
{{- end }}

{{/* The device a route's server runs on (routes of one device share its GPU): `device`,
else 0; a server the chart does not run is on a device of its own unless it says. */}}
{{- define "specroute.device" -}}
{{- if include "specroute.served" . }}{{ toString (.device | default 0) }}
{{- else }}{{ toString (.device | default .name) }}
{{- end }}
{{- end }}

{{/* The URL the gateway (and the picker) reach a route's server at. Takes (list $ route). */}}
{{- define "specroute.url" -}}
{{- $root := index . 0 }}{{ $route := index . 1 }}
{{- if $route.url }}{{ $route.url }}
{{- else }}{{ printf "http://%s:%v" ($route.service | default (printf "vllm-%s" $route.name)) $root.Values.vllm.port }}
{{- end }}
{{- end }}

{{/* The route Envoy sends what the picker did not route: the first without speculation. */}}
{{- define "specroute.defaultRoute" -}}
{{- $found := "" }}
{{- range .Values.routes }}
{{- if and (not $found) (eq (.method | default "none") "none") }}{{ $found = .name }}{{ end }}
{{- end }}
{{- required "routes: one route must have method none (the fallback of every layout)" $found }}
{{- end }}

{{/* The image of one kind ("gateway", "vllm"). Takes (list $ kind). */}}
{{- define "specroute.image" -}}
{{- $image := index (index . 0).Values.images (index . 1) }}
{{- printf "%s:%s" $image.repository (toString $image.tag) }}
{{- end }}

{{/* The pod template's annotation that rolls the pods when config.toml changes
(kustomize's content-hashed ConfigMap name does it there). */}}
{{- define "specroute.configChecksum" -}}
checksum/config: {{ include "specroute.configToml" . | sha256sum }}
{{- end }}

{{/* The volumes the gateway and the picker share: config.toml, a cache, /tmp. */}}
{{- define "specroute.gatewayVolumes" -}}
- name: config
  configMap:
    name: specroute-config
- name: cache
  emptyDir:
    sizeLimit: 256Mi
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end }}

{{- define "specroute.gatewayMounts" -}}
- name: config
  mountPath: /etc/specroute
  readOnly: true
- name: cache
  mountPath: /cache
- name: tmp
  mountPath: /tmp
{{- end }}

{{- define "specroute.gatewayEnv" -}}
- name: SPECROUTE_VLLM_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.backendKeys.name }}
      key: vllm-api-key
- name: XDG_CACHE_HOME
  value: /cache
{{- end }}

{{/* Non-root, read-only: the pod and container security of the gateway and the picker. */}}
{{- define "specroute.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "specroute.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* A RollingUpdate where the new pod is ready before the old one drains. */}}
{{- define "specroute.rollingUpdate" -}}
type: RollingUpdate
rollingUpdate:
  maxUnavailable: 0
  maxSurge: 1
{{- end }}
