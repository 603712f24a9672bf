"""A cloud deployment's own settings (docs/protocols.md): where the model lives and how the
gateway authenticates to it. Secrets never appear here: only where to find them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AzureSettings(_Model):
    """Azure OpenAI: `upstream_model` is the deployment name; the key or token comes from
    `api_key_env` / `api_key_file` (an Entra ID token a sidecar or workload identity rotates)."""

    api_version: str = Field(min_length=1)
    auth: Literal["api-key", "entra"] = "api-key"


class BedrockSettings(_Model):
    """AWS Bedrock: credentials as the AWS SDKs resolve them (environment, shared files and
    `profile`, an assumed role or web identity, container/instance metadata)."""

    region: str = Field(pattern=r"^[a-z0-9-]+$")
    profile: str | None = None
    # A shared credentials file other than ~/.aws/credentials (AWS_SHARED_CREDENTIALS_FILE's role).
    credentials_file: str | None = None
    # The Host signed into SigV4 (default: the first endpoint's, port kept unless 443).
    host: str | None = None


class VertexSettings(_Model):
    """Vertex AI: Gemini (`publisher: google`) or Claude (`publisher: anthropic`) in `project` at
    `location`; OAuth2 tokens from `credentials_file` (a service-account key) or, without one,
    Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud, the metadata server)."""

    project: str = Field(min_length=1)
    location: str = Field(pattern=r"^[a-z0-9-]+$")
    publisher: Literal["google", "anthropic"] = "google"
    credentials_file: str | None = None
