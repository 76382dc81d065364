{{/* Names shared by every template. */}}
{{- define "fluxnetes.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fluxnetes.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fluxnetes.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "fluxnetes.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fluxnetes.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "fluxnetes.webhookService" -}}
{{- printf "%s-webhook" (include "fluxnetes.fullname" .) -}}
{{- end -}}

{{- /* The Secret the operator makes for its webhook certificate (and the agents' CA). Its
name is fixed in the operator (fluxnetes.k8s.admission.install.SECRET_NAME), whatever the
release is called: one per namespace. */ -}}
{{- define "fluxnetes.webhookSecret" -}}
fluxnetes-webhook-cert
{{- end -}}

{{- define "fluxnetes.postgresName" -}}
{{- printf "%s-postgresql" (include "fluxnetes.fullname" .) -}}
{{- end -}}

{{/* "true" when the PostgreSQL password is made in the cluster (postgresql.auth.generateInCluster). */}}
{{- define "fluxnetes.pgPasswordInCluster" -}}
{{- if and .Values.postgresql.enabled .Values.postgresql.auth.generateInCluster -}}true{{- end -}}
{{- end -}}

{{/* The bundled PostgreSQL's URL with the given password (dict: root, password). */}}
{{- define "fluxnetes.postgresURL" -}}
{{- $v := .root.Values.postgresql.auth -}}
{{- $host := printf "%s.%s.svc" (include "fluxnetes.postgresName" .root) .root.Release.Namespace -}}
{{- printf "postgresql+psycopg://%s:%s@%s:5432/%s" $v.username .password $host $v.database -}}
{{- end -}}

{{/* Secret holding the store URL (key `url`) read by the operator. */}}
{{- define "fluxnetes.storeSecret" -}}
{{- if .Values.store.existingSecret -}}
{{- .Values.store.existingSecret -}}
{{- else -}}
{{- printf "%s-store" (include "fluxnetes.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "fluxnetes.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The --policy flag: hybrid carries its reservation depth (hybrid:N). */}}
{{- define "fluxnetes.queuePolicy" -}}
{{- if eq .Values.scheduler.queuePolicy "hybrid" -}}
{{- printf "hybrid:%d" (int .Values.scheduler.reservationDepth) -}}
{{- else -}}
{{- .Values.scheduler.queuePolicy -}}
{{- end -}}
{{- end -}}

{{/* Restricted pod security for every container of the chart. */}}
{{- define "fluxnetes.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Fail early on values the operator would reject anyway. */}}
{{- define "fluxnetes.validate" -}}
{{- $queue := list "fcfs" "easy" "conservative" "hybrid" -}}
{{- if not (has .Values.scheduler.queuePolicy $queue) -}}
{{- fail (printf "scheduler.queuePolicy: must be one of %s, got %q" (join ", " $queue) .Values.scheduler.queuePolicy) -}}
{{- end -}}
{{- $match := list "first" "low" "high" "lonode" "hinode" "lonodex" "hinodex" "firstnodex" "locality" "variation" -}}
{{- if not (has .Values.scheduler.matchPolicy $match) -}}
{{- fail (printf "scheduler.matchPolicy: must be one of %s, got %q" (join ", " $match) .Values.scheduler.matchPolicy) -}}
{{- end -}}
{{- if lt (int .Values.scheduler.reservationDepth) 0 -}}
{{- fail (printf "scheduler.reservationDepth: must be >= 0, got %v" .Values.scheduler.reservationDepth) -}}
{{- end -}}
{{- if not (has .Values.webhook.failurePolicy (list "Ignore" "Fail")) -}}
{{- fail (printf "webhook.failurePolicy: must be Ignore or Fail, got %q" .Values.webhook.failurePolicy) -}}
{{- end -}}
{{- if and (not .Values.postgresql.enabled) (not .Values.store.url) (not .Values.store.existingSecret) -}}
{{- fail "store: with postgresql.enabled=false, set store.url (postgresql+psycopg://user:pass@host:5432/db) or store.existingSecret" -}}
{{- end -}}
{{- if and .Values.postgresql.enabled (or .Values.store.url .Values.store.existingSecret) -}}
{{- fail "store: store.url/store.existingSecret point at an external database; set postgresql.enabled=false with them" -}}
{{- end -}}
{{- if and .Values.postgresql.auth.generateInCluster .Values.postgresql.auth.password -}}
{{- fail "postgresql.auth.generateInCluster: the password is made in the cluster; leave postgresql.auth.password empty with it" -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9_]+$" .Values.postgresql.auth.username) -}}
{{- fail (printf "postgresql.auth.username: letters, digits and _ only (it goes into the store URL), got %q" .Values.postgresql.auth.username) -}}
{{- end -}}
{{- if not (has .Values.scheduler.placement (list "auto" "affinity" "bind")) -}}
{{- fail (printf "scheduler.placement: must be auto, affinity or bind, got %q" .Values.scheduler.placement) -}}
{{- end -}}
{{- if not (has .Values.scheduler.jobMode (list "auto" "suspend" "gate")) -}}
{{- fail (printf "scheduler.jobMode: must be auto, suspend or gate, got %q" .Values.scheduler.jobMode) -}}
{{- end -}}
{{- if not (has .Values.scheduler.fluxjobs (list "waiting" "all")) -}}
{{- fail (printf "scheduler.fluxjobs: must be waiting or all, got %q" .Values.scheduler.fluxjobs) -}}
{{- end -}}
{{- if not (has .Values.scheduler.onNodeLost (list "fail" "requeue")) -}}
{{- fail (printf "scheduler.onNodeLost: must be fail or requeue, got %q" .Values.scheduler.onNodeLost) -}}
{{- end -}}
{{- if contains "=" .Values.webhook.namespaceLabel -}}
{{- fail (printf "webhook.namespaceLabel: a label key only (the value is always \"true\"), got %q" .Values.webhook.namespaceLabel) -}}
{{- end -}}
{{- if lt (int .Values.replicas) 1 -}}
{{- fail (printf "replicas: must be >= 1, got %v" .Values.replicas) -}}
{{- end -}}
{{- end -}}
