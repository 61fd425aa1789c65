{{/* Chart name, overridable. */}}
{{- define "kandev-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of every resource: the release name when it already contains the chart name (so
`helm install kandev-operator …` gives ServiceAccount, Deployment and ClusterRole
`kandev-operator`), else <release>-<chart>.
*/}}
{{- define "kandev-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kandev-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "kandev-operator.labels" -}}
helm.sh/chart: {{ include "kandev-operator.chart" . }}
{{ include "kandev-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kandev
{{- end }}

{{/* Labels that select the operator pods. */}}
{{- define "kandev-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kandev-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kandev-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kandev-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository@digest when a digest is set, else repository:tag (default: the appVersion). */}}
{{- define "kandev-operator.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) }}
{{- end }}
{{- end }}

{{- define "kandev-operator.image" -}}
{{- include "kandev-operator.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) }}
{{- end }}

{{- define "kandev-operator.agentctlImage" -}}
{{- include "kandev-operator.imageRef" (dict "image" .Values.agentctlImage "appVersion" .Chart.AppVersion) }}
{{- end }}

{{- define "kandev-operator.profilesConfigMap" -}}
{{- printf "%s-agent-profiles" (include "kandev-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The profiles file the operator reads with --agent-profiles. */}}
{{- define "kandev-operator.profilesFile" -}}
{{ dict "profiles" .Values.agentProfiles | toYaml }}
{{- end }}

{{/* The RBAC rules of the namespaces the operator serves (Scope::Watched of REQUIRED_PERMISSIONS). */}}
{{- define "kandev-operator.sessionRules" -}}
# Watch every TaskSession; the kandev.dev/cleanup finalizer is added and removed by JSON patch.
- apiGroups: ["kandev.dev"]
  resources: ["tasksessions"]
  verbs: ["list", "watch", "patch"]
# Status is written with server-side apply.
- apiGroups: ["kandev.dev"]
  resources: ["tasksessions/status"]
  verbs: ["patch"]
- apiGroups: ["kandev.dev"]
  resources: ["executorrunnings"]
  verbs: ["get", "list", "watch", "create"]
- apiGroups: ["kandev.dev"]
  resources: ["executorrunnings/status"]
  verbs: ["patch"]
# agentctl pods: created on a launch, deleted after a failed restore.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
# ACP over a WebSocket exec: the upgrade is a GET, and since Kubernetes 1.35 the API server
# also requires create (AuthorizePodWebsocketUpgradeCreatePermission).
- apiGroups: [""]
  resources: ["pods/exec"]
  verbs: ["get", "create"]
# Workspace PVCs: checked before a launch (from a metadata cache), created from a session's
# template.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create"]
# The NetworkPolicy of each session, applied (server-side) with its agent pod (owned by the
# session); an apply that creates needs create too.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* The operator's user name, as the API server sees its ServiceAccount token. */}}
{{- define "kandev-operator.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "kandev-operator.serviceAccountName" .) }}
{{- end }}

{{/*
resources.limits.memory in MiB, rounded down (whole or decimal numbers with a binary or decimal
suffix, or bytes); "" when unset or unreadable.
*/}}
{{- define "kandev-operator.memoryLimitMiB" -}}
{{- $v := dig "limits" "memory" "" (.Values.resources | default dict) -}}
{{- if or (kindIs "float64" $v) (kindIs "int64" $v) (kindIs "int" $v) -}}
{{- /* a plain number of bytes (YAML and --set make it a number) */ -}}
{{- div (int64 $v) 1048576 -}}
{{- else -}}
{{- $q := toString $v -}}
{{- if regexMatch "^[0-9]+([.][0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$" $q -}}
{{- $num := regexFind "^[0-9]+([.][0-9]+)?" $q -}}
{{- $factor := get (dict "" 1.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0) (trimPrefix $num $q) -}}
{{- divf (mulf (float64 $num) $factor) 1048576.0 | floor | int64 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The restores' memory budget (controller.acpMemoryBudgetMiB, else half of the memory limit) must
hold one restore with a session/load, 3 × controller.acpReplayLineLimitMiB: refused otherwise,
as the operator would refuse to start. The budget in MiB, or "" when there is none to check.
*/}}
{{- define "kandev-operator.memoryBudgetMiB" -}}
{{- $limit := include "kandev-operator.memoryLimitMiB" . -}}
{{- if .Values.controller.acpMemoryBudgetMiB -}}
{{- .Values.controller.acpMemoryBudgetMiB -}}
{{- else if $limit -}}
{{- div (atoi $limit) 2 -}}
{{- end -}}
{{- end -}}

{{- define "kandev-operator.checkMemoryBudget" -}}
{{- $budget := include "kandev-operator.memoryBudgetMiB" . -}}
{{- $need := mul 3 .Values.controller.acpReplayLineLimitMiB -}}
{{- if and $budget (lt (atoi $budget) (int $need)) -}}
{{- fail (printf "controller.acpMemoryBudgetMiB: the restores' memory budget of %s MiB (0: half of resources.limits.memory) cannot hold one session/load, which needs %d MiB (3 × controller.acpReplayLineLimitMiB): raise the memory limit or the budget, or lower acpReplayLineLimitMiB" $budget (int $need)) -}}
{{- end -}}
{{- end -}}

{{/*
agentPods.nodeSelector as a CEL list of "key=value" strings, for the admission policy.
*/}}
{{- define "kandev-operator.nodeSelectorPairs" -}}
{{- $pairs := list -}}
{{- range $k, $v := .Values.agentPods.nodeSelector -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- toJson $pairs -}}
{{- end -}}

{{/*
The tolerations an agent pod may carry, as a CEL list of "key|operator|value|effect" strings for
the admission policy: agentPods.tolerations as the operator builds them (--pod-toleration:
Equal with a value, Exists without), and the API server's default not-ready and unreachable
ones (DefaultTolerationSeconds adds them before validation).
*/}}
{{- define "kandev-operator.tolerationKeys" -}}
{{- $keys := list "node.kubernetes.io/not-ready|Exists||NoExecute" "node.kubernetes.io/unreachable|Exists||NoExecute" -}}
{{- range .Values.agentPods.tolerations -}}
{{- $keys = append $keys (printf "%s|%s|%s|%s" .key (ternary "Equal" "Exists" (not (empty .value))) (toString (default "" .value)) .effect) -}}
{{- end -}}
{{- toJson $keys -}}
{{- end -}}
