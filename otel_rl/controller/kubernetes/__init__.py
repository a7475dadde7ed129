"""Rollouts as Kubernetes Jobs (docs/controller.md, "Rollouts as Kubernetes Jobs")."""

from otel_rl.controller.kubernetes.settings import KubernetesSettings

__all__ = ["KubernetesSettings"]
