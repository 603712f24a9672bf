"""A deployment that may have no replica running (`scale_from_zero:`): the gateway holds its callers in
the deployment's queue, asks for a replica (the Kubernetes scale subresource or a webhook) and serves
them once its health check passes and its warm-up answered (extproc/admission/waking.py).

A section rather than a `min_replicas: 0` flag: the gateway does not own the replica count (the
autoscaler does, scale-down included); what it must know is whom to ask for the first replica."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The standard in-cluster paths of a pod's service account.
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubernetesScaleTarget(BaseModel):
    """PATCH {api_url}/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}/scale."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    deployment: str = Field(pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
    replicas: int = Field(1, ge=1)
    api_url: str = Field("https://kubernetes.default.svc", pattern=r"^https?://")
    token_file: str = f"{SA_DIR}/token"
    ca_file: str | None = f"{SA_DIR}/ca.crt"  # None: the system's trust store (or plain http)


class ScaleFromZero(BaseModel):
    """Exactly one of `kubernetes` (the scale subresource) or `webhook` (a POST of
    `{"cluster", "model", "replicas"}`, any 2xx is accepted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubernetes: KubernetesScaleTarget | None = None
    webhook: str | None = Field(None, pattern=r"^https?://")
    # While callers wait and no replica is ready: a new scale request this often, readiness probed this often.
    retry_s: float = Field(10.0, gt=0, le=600)
    probe_s: float = Field(0.25, gt=0, le=60)

    @model_validator(mode="after")
    def _one_way(self) -> ScaleFromZero:
        if (self.kubernetes is None) == (self.webhook is None):
            raise ValueError("scale_from_zero: set exactly one of kubernetes or webhook")
        return self
