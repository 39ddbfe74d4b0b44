{{/* The chart name, possibly overridden. */}}
{{- define "maka-eval.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every resource name: the release name when it already says maka-eval. */}}
{{- define "maka-eval.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "maka-eval.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object (never on Pod templates: see the selectors below). */}}
{{- define "maka-eval.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: maka-eval
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The operator's Pods. */}}
{{- define "maka-eval.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "maka-eval.fullname" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The gateway's Pods. The operator's attempt NetworkPolicies allow egress to Pods labelled
app.kubernetes.io/name: maka-eval-egress-gateway (maka_eval.k8s.egress.GATEWAY_POD_LABELS),
whatever the release is called.
*/}}
{{- define "maka-eval.gateway.selectorLabels" -}}
app.kubernetes.io/name: maka-eval-egress-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "maka-eval.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "maka-eval.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- required "operator.serviceAccount.name: name the existing ServiceAccount when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "maka-eval.gateway.name" -}}
{{- printf "%s-egress-gateway" (include "maka-eval.fullname" .) -}}
{{- end -}}

{{/* The Secret holding the gateway key (read by the operator, mounted by the gateway). */}}
{{- define "maka-eval.gateway.keySecret" -}}
{{- default (include "maka-eval.gateway.name" .) .Values.egressGateway.key.existingSecret -}}
{{- end -}}

{{/* repository:tag or repository@digest. */}}
{{- define "maka-eval.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The name of kopf's peering object (replicas > 1). */}}
{{- define "maka-eval.peeringName" -}}
{{- include "maka-eval.fullname" . -}}
{{- end -}}

{{/*
What the operator may do to the objects in the namespaces it serves: exactly the calls
it makes (maka_eval.k8s.cluster.Cluster and kopf's watches); docs/helm.md explains each.
*/}}
{{- define "maka-eval.operator.namespacedRules" -}}
# Experiments are written by people: the operator lists and watches them (kopf) and
# writes nothing but their status.
- apiGroups: [eval.maka.dev]
  resources: [experiments]
  verbs: [list, watch]
# Cells and Attempts are the operator's own: created once under deterministic names
# (get after a 409), listed at start-up, watched.
- apiGroups: [eval.maka.dev]
  resources: [cells, attempts]
  verbs: [get, list, watch, create]
# Only the operator writes status (the aggregated user roles grant none of it).
- apiGroups: [eval.maka.dev]
  resources: [experiments/status, cells/status, attempts/status]
  verbs: [patch]
# One Pod per Attempt: patch lifts a task group's scheduling gate, delete ends a Pod stuck
# pulling its image past imagePullDeadlineSec. No pods/exec, pods/log or pods/attach:
# results come back in the container's termination message.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete]
# One deny-by-default NetworkPolicy per Attempt.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create]
# get: a declared credential's Secret and key exist before anything starts (the values
# reach only the subject's Pod, through secretKeyRef); create: per attempt with the egress
# proxy, the Secret holding its gateway credential (mounted by its sidecar alone).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
# Events for the changes a user looks for (attempt started/finished, retries, results).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}
