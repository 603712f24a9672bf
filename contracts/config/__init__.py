"""`modelyard.yaml`: typed, validated configuration for Envoy and the extproc service.

Every section is a pydantic model with `extra="forbid"`, so a misspelt key fails at load time
with the key path named. The feature sections (`routing:`, `ratelimit:`) are their modules' own
models, parsed here once. `load_config` turns every failure into `ConfigError`, never a traceback.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contracts.config.balancing import HealthCheckConfig, LoadBalancing, ReplicaMetrics, WarmupConfig
from contracts.config.clouds import AzureSettings, BedrockSettings, VertexSettings
from contracts.config.console import ConsoleConfig
from contracts.config.endpoint_picker import EndpointPickerConfig
from contracts.config.guardrails import GuardrailsConfig
from contracts.config.keys import Budget, KeysConfig, sha256_digests
from contracts.config.live import ControlPlaneConfig
from contracts.config.mcp import McpServer, McpSettings
from contracts.config.prices import table_cost
from contracts.config.queueing import DedicatedPool, QueueSettings
from contracts.config.ratelimit import RateLimitConfig
from contracts.config.response_cache import CachePolicy, ResponseCacheStore, check_embedding_models
from contracts.config.routing import RoutingSettings
from contracts.config.scaling import ScaleFromZero
from contracts.config.service_levels import Channel, LatencyObjective, Tier
from contracts.errors import ConfigError
from contracts.params import DropParams, check_drop_params

CONFIG_ENV = "MODELYARD_CONFIG"
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "modelyard.yaml"

Protocol = Literal["openai", "anthropic", "gemini", "responses", "kserve-grpc", "kserve-rest", "azure-openai", "bedrock",
                   "vertex"]
# Each cloud protocol and the settings section it requires (extproc/config/clouds.py).
NATIVE_BATCH_PROTOCOLS = ("openai", "anthropic", "bedrock", "vertex")  # deployments with a batch API the gateway drives
CLOUD_SECTIONS = {"azure-openai": "azure", "bedrock": "bedrock", "vertex": "vertex"}
KSERVE_PROTOCOLS = ("kserve-grpc", "kserve-rest")
TaskType = Literal["chat", "completion", "embedding", "image-classification", "infer",
                   "image-generation", "transcription", "speech",  # these three: /v1/images, /v1/audio
                   "moderation"]  # /v1/moderations (docs/guardrails.md)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ListenerConfig(_Model):
    address: str = "127.0.0.1"
    port: int = Field(10000, ge=1, le=65535)


class TracingConfig(_Model):
    """OpenTelemetry spans over OTLP (docs/operations.md). A collector's credentials come from
    OTEL_EXPORTER_OTLP_HEADERS in the environment, never from this file."""

    # http/protobuf: the full URL (…/v1/traces); grpc: http://host:port (plaintext) or https://host:port.
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    service_name: str = "modelyard"
    # Of the traces that start here; a caller's sampled flag in `traceparent` is followed as sent.
    sample_ratio: float = Field(1.0, ge=0, le=1)
    # The batch exporter's period: spans leave in a background thread, never on the event loop.
    export_delay_ms: int = Field(2000, ge=10, le=60_000)
    export_timeout_s: float = Field(10.0, gt=0)


class TasksConfig(_Model):
    """Async tasks (`Prefer: respond-async`, docs/tasks.md): where they are kept and how they run."""

    store: Literal["sqlite", "redis"] = "sqlite"
    sqlite_path: str = "run/tasks.sqlite"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "modelyard:tasks:"
    # Finished tasks (and their results) are deleted this long after they end.
    ttl_s: float = Field(24 * 3600.0, gt=0)
    # Where the worker replays a task: Envoy's listener (default: this config's listener).
    replay_url: str | None = None
    replay_timeout_s: float = Field(600.0, gt=0)
    concurrency: int = Field(4, ge=1, le=256)
    # A running task's owner renews its lease; one left to expire was interrupted and is retried once.
    lease_s: float = Field(30.0, gt=0)
    # `?wait=N` is capped here (Envoy's timer is extended every few seconds while a poll waits).
    max_wait_s: float = Field(60.0, ge=0)
    # The HMAC key of the replay marker: replicas sharing a store must share it (else a per-process key).
    secret_env: str | None = None


class S3FileStore(_Model):
    """Files and batch outputs in an S3-compatible bucket (docs/batches.md "S3 file store"): the bytes
    go there, SigV4-signed (botocore's signer); their records stay in `sqlite_path`. Credentials come
    from the environment variables named here, or an AWS shared credentials file (a mounted secret),
    read when used and never logged."""

    kind: Literal["s3"] = "s3"
    endpoint: str = Field(pattern=r"^https?://[^/\s]+$")  # scheme://host[:port]; path-style addressing
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    region: str = Field("us-east-1", pattern=r"^[a-z0-9-]+$")
    prefix: str = ""  # every object key starts with it
    access_key_env: str = "AWS_ACCESS_KEY_ID"
    secret_key_env: str = "AWS_SECRET_ACCESS_KEY"
    session_token_env: str = "AWS_SESSION_TOKEN"
    credentials_file: str | None = None  # [profile] aws_access_key_id / aws_secret_access_key; wins when set
    profile: str = "default"
    timeout_s: float = Field(30.0, gt=0)


class BatchesConfig(_Model):
    """Files and batch APIs (`/v1/files`, `/v1/batches`, `/v1/messages/batches`; docs/batches.md): files
    and batch records in SQLite; each batch line runs as an async task (needs `extproc.tasks`)."""

    sqlite_path: str = "run/batches.sqlite"
    max_file_bytes: int = Field(32 * 1024 * 1024, ge=1)  # one upload (Envoy's body buffer bounds it too)
    max_files_per_tenant: int = Field(1000, ge=1)
    max_lines: int = Field(50_000, ge=1)  # requests in one batch, as OpenAI and Anthropic allow
    # How often open batches are checked for lines that ended, and finished ones written out.
    finalize_every_s: float = Field(1.0, gt=0)
    # Where file bytes live: None keeps them in `sqlite_path` (the embedded default).
    file_store: S3FileStore | None = None


class ExtprocConfig(_Model):
    address: str = "127.0.0.1:50051"
    metrics_address: str = "127.0.0.1:9464"
    # Where image preprocessing runs: auto picks CuPy when a device is present.
    image_backend: Literal["auto", "cpu", "gpu"] = "auto"
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    drain_seconds: float = Field(10.0, ge=0)
    metering_db: str | None = None
    # OpenTelemetry tracing; absent (the default) means off, with nothing of OpenTelemetry loaded.
    tracing: TracingConfig | None = None
    # Append-only, hash-chained audit log (docs/audit.md); `modelyard audit verify` checks it.
    audit_db: str | None = None
    # Queued audit rows past which new calls get 503: fail closed, never serve unrecorded calls.
    audit_max_queued: int = Field(100_000, ge=1)
    tasks: TasksConfig | None = None  # off: `Prefer: respond-async` is ignored, /v1/tasks is a 404
    batches: BatchesConfig | None = None  # off: /v1/files, /v1/batches and /v1/messages/batches are 404s
    # extproc processes on this host (contracts/workers.py), on ports address+0..N-1; None: half the cores
    workers: int | None = Field(None, ge=1, le=64)
    # The event loop under grpc.aio: uvloop cuts the extproc's CPU per request (docs/performance.md);
    # asyncio is the standard library's, for a platform without uvloop.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # A local extproc also listens on this Unix socket (worker i on `<path>.<i>`), and the rendered
    # Envoy reaches it there instead of loopback TCP (docs/performance.md); listed or TLS extprocs stay on TCP.
    unix_socket: str | None = None
    # Who serves that socket: h2 parses HTTP/2 on the event loop (no grpc core threads to hand each
    # message between: less CPU and latency, docs/performance.md); grpcio is grpc.aio, as TCP is.
    unix_socket_server: Literal["h2", "grpcio"] = "h2"
    # How Envoy hands the chat calls' bodies over: duplex (FULL_DUPLEX_STREAMED: each headers reply waits
    # for its body, two sequential waits per call instead of four; docs/operations.md) or buffered (four).
    # Buffered unless set: an extproc of an earlier release cannot answer a duplex stream, so a config turns
    # it on once every extproc runs this one. Every other path stays buffered.
    bodies: Literal["duplex", "buffered"] = "buffered"

    @field_validator("unix_socket_server", mode="before")
    @classmethod
    def _grpclib_is_h2_now(cls, v: Any) -> Any:
        # The last release's default; h2 took its place (the same HTTP/2 on the loop, less of it in Python).
        if v == "grpclib":
            logging.getLogger("modelyard.config").warning(
                "extproc.unix_socket_server: grpclib is served by h2 now; write h2 (or grpcio)")
            return "h2"
        return v

    @model_validator(mode="after")
    def _batches_need_tasks(self) -> ExtprocConfig:
        if self.batches is not None and self.tasks is None:
            raise ValueError("extproc.batches needs extproc.tasks: each batch line runs as a task")
        return self


class Capabilities(_Model):
    context_window: int = Field(8192, ge=1)
    max_output_tokens: int = Field(4096, ge=1)
    tools: bool = False
    vision: bool = False
    streaming: bool = True


class PriceStep(_Model):
    """The prices once a call's prompt (cached tokens included) is longer than `above_prompt_tokens`;
    a price left out stays the base one."""

    above_prompt_tokens: int = Field(ge=1)
    input_per_1k: float | None = Field(None, ge=0)
    output_per_1k: float | None = Field(None, ge=0)
    cached_input_per_1k: float | None = Field(None, ge=0)
    cache_write_per_1k: float | None = Field(None, ge=0)
    cache_write_1h_per_1k: float | None = Field(None, ge=0)


class Cost(_Model):
    """USD per 1k tokens, as invoiced. `table: NAME` takes the shipped price table's entry
    (contracts/config/prices.yaml); a price set beside it overrides that entry's."""

    table: str | None = None
    input_per_1k: float = Field(0.0, ge=0)  # uncached prompt tokens
    output_per_1k: float = Field(0.0, ge=0)
    cached_input_per_1k: float | None = Field(None, ge=0)  # read from the prompt cache; None: the input price
    cache_write_per_1k: float | None = Field(None, ge=0)  # written to it (5-minute TTL); None: the input price
    cache_write_1h_per_1k: float | None = Field(None, ge=0)  # 1-hour TTL writes; None: the 5-minute price
    long_prompt: tuple[PriceStep, ...] = ()  # steps up past a prompt length (Gemini 2.5 Pro, Claude Sonnet 4)
    # The fraction off a batch line's cost (0.5: half price, as OpenAI's and Anthropic's batch APIs bill).
    batch_discount: float | None = Field(None, ge=0, le=1)
    # Images and audio (/v1/images, /v1/audio) bill in the provider's own units, not tokens.
    per_image: float = Field(0.0, ge=0)
    per_audio_second: float = Field(0.0, ge=0)  # transcriptions and translations, per second of audio
    per_1k_characters: float = Field(0.0, ge=0)  # speech, per 1k characters of `input`
    # Web search a provider runs as a tool and bills apart from tokens: per search (Gemini 3's grounding
    # queries, a Responses web_search call), and per answer that searched at all (Gemini 2.x's grounded prompts).
    per_web_search: float = Field(0.0, ge=0)
    per_grounded_prompt: float = Field(0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _from_table(cls, data: Any) -> Any:
        if type(data) is dict and data.get("table") is not None:
            return {**table_cost(str(data["table"])), **data}
        return data

    @model_validator(mode="after")
    def _steps_ascend(self) -> Cost:
        bounds = [s.above_prompt_tokens for s in self.long_prompt]
        if bounds != sorted(set(bounds)):
            raise ValueError("long_prompt: steps must go up, each above_prompt_tokens larger than the last")
        return self


class TensorInput(_Model):
    """What a vision model expects; the multipart path preprocesses images into this."""

    name: str = "input"
    width: int = Field(224, ge=1, le=8192)
    height: int = Field(224, ge=1, le=8192)
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    channel_order: Literal["RGB", "BGR"] = "RGB"
    datatype: Literal["FP32", "FP16"] = "FP32"
    scale: float = 1.0 / 255.0


class VisionConfig(_Model):
    input: TensorInput = TensorInput()
    output: str = "scores"
    labels: list[str] = Field(default_factory=list)
    max_images: int = Field(16, ge=1, le=256)
    max_image_pixels: int = Field(40_000_000, ge=1)
    # Per request, checked from the headers before anything is decoded (docs/security.md); the
    # same defaults as adapters.images.ImageBudget, kept literal so config does not import Pillow.
    max_request_pixels: int = Field(50_000_000, ge=1)
    max_decoded_bytes: int = Field(384 * 1024 * 1024, ge=1)


class BatchPadConfig(_Model):
    """Token ids of different lengths padded to a bucket so they merge (docs/batching.md "Padding").
    `outputs` declares the outputs that hold one row per sequence, whatever its padded length (an
    embedding, logits per sequence): only calls asking for those alone are padded."""

    input: str
    buckets: list[int] = Field(min_length=1)
    pad_id: int = 0
    mask: str | None = None  # the attention-mask input, padded with 0s
    lengths: str | None = None  # a per-sequence lengths input ([n] or [n, 1]: seq_len), each row its own length
    outputs: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> BatchPadConfig:
        if any(b < 1 or b > 65536 for b in self.buckets) or self.buckets != sorted(set(self.buckets)):
            raise ValueError("pad.buckets must be distinct lengths from 1 to 65536, ascending")
        if self.mask == self.input:
            raise ValueError("pad.mask must name another input than pad.input")
        if self.lengths is not None and self.lengths in (self.input, self.mask):
            raise ValueError("pad.lengths must name another input than pad.input and pad.mask")
        return self


class BatchingConfig(_Model):
    enabled: bool = True
    max_delay_ms: float = Field(5.0, ge=0, le=1000)
    min_size: int = Field(4, ge=1, le=32)
    max_size: int = Field(16, ge=1, le=32)
    pad: BatchPadConfig | None = None

    @model_validator(mode="after")
    def _sizes(self) -> BatchingConfig:
        if self.min_size > self.max_size:
            raise ValueError("min_size must not exceed max_size")
        return self


def _ip_literal(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class WatermarkSource(_Model):
    url: str
    kind: Literal["agent", "dcgm"] = "agent"


class NativeBatch(_Model):
    """A batch whose every line names this deployment's model runs at the provider's own batch API
    (OpenAI Files + Batches, Anthropic Message Batches), polled in the background (docs/batches.md)."""

    mode: Literal["native", "replay"] = "native"  # replay: each line through the gateway (the default)
    poll_every_s: float = Field(5.0, gt=0)
    # Bedrock batch inference and Vertex batch prediction (docs/batches.md): the job reads its input
    # from and writes its output to this bucket (S3 or GCS; Bedrock as the IAM role `role_arn`); the
    # gateway signs with the deployment's AWS credentials or Google token.
    bucket: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
    role_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    prefix: str = "modelyard-batches/"  # every key the gateway writes starts with it
    # scheme://host[:port] of S3 (path-style; default AWS's for the region) and of Bedrock's control
    # plane (default: the runtime endpoint with `bedrock-runtime.` as `bedrock.`).
    s3_endpoint: str | None = Field(None, pattern=r"^https?://[^/]+$")
    control_endpoint: str | None = Field(None, pattern=r"^https?://[^/]+$")
    # Vertex: scheme://host[:port] of the Cloud Storage JSON API (default Google's).
    gcs_endpoint: str | None = Field(None, pattern=r"^https?://[^/]+$")
    # A provider refuses a job of fewer records (Bedrock: its per-account quota, 100 by default):
    # a smaller batch is replayed line by line instead. Default: 100 on bedrock, else 1.
    min_records: int | None = Field(None, ge=1)


class Deployment(_Model):
    cluster: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    protocol: Protocol
    channel: Channel = "standard"
    endpoints: list[str] = Field(min_length=1)
    # The model name the upstream knows; defaults to the gateway's model name.
    upstream_model: str | None = None
    # OpenAI deployments: the output-token cap's field in a translated request. OpenAI documents
    # max_completion_tokens (its reasoning models refuse max_tokens); older OpenAI-compatible
    # servers know only max_tokens.
    max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = "max_completion_tokens"
    # A control this protocol cannot express (top_k to OpenAI): 400 (unset/false), or drop it:
    # true for all, a list for those named (contracts/params.py); wins over the model's.
    drop_params: DropParams = None
    # A translated answer's reasoning (OpenAI summaries, Anthropic thinking, Gemini thoughts): shown
    # in the caller's protocol (chat: `reasoning_content`, as vLLM, DeepSeek and LiteLLM send it),
    # or dropped, as OpenAI's own Chat Completions hides it.
    reasoning: Literal["show", "drop"] = "show"
    api_key_env: str | None = None
    api_key_file: str | None = None
    timeout_ms: int = Field(60_000, ge=1)
    tls: bool = False
    # Upstream TLS is verified: the CA bundle to trust (default: the system's, found at render
    # time), an optional client certificate for mTLS, or an explicit, loudly logged opt-out.
    tls_ca_file: str | None = None
    tls_client_cert_file: str | None = None
    tls_client_key_file: str | None = None
    tls_insecure_skip_verify: bool = False
    watermark: WatermarkSource | None = None
    lb: LoadBalancing = LoadBalancing()
    health_check: HealthCheckConfig | None = None
    warmup: WarmupConfig | None = None
    # Readings per endpoint and a replica picked per request (docs/routing.md); None: Envoy balances alone.
    replica_metrics: ReplicaMetrics | None = None
    # A latency objective: over it (measured by the gateway), the deployment counts as loaded (docs/routing.md).
    slo: LatencyObjective | None = None
    # Concurrency: at most this many requests in flight here; the rest wait in `queue` (None: no limit).
    max_inflight: int | None = Field(None, ge=1)
    queue: QueueSettings = QueueSettings()
    # No replica may be running: callers wait in `queue` while one is asked for (contracts/config/scaling.py).
    scale_from_zero: ScaleFromZero | None = None
    # A dedicated pool: only these tiers or tenants are routed here.
    reserved_for: DedicatedPool | None = None
    # Spot / preemptible capacity: under a spot-first strategy (routing.spot_first) an idle one is preferred.
    spot: bool = False
    # This deployment's own price, when it differs from the model's (spot capacity is usually cheaper).
    cost: Cost | None = None
    # Cloud upstreams: the section for this deployment's protocol (CLOUD_SECTIONS), and only it.
    azure: AzureSettings | None = None
    bedrock: BedrockSettings | None = None
    vertex: VertexSettings | None = None
    # Batches at the provider's own batch API (openai and anthropic deployments); None: lines replayed.
    batch: NativeBatch | None = None

    _drop_params = field_validator("drop_params")(check_drop_params)

    @field_validator("endpoints")
    @classmethod
    def _host_port(cls, v: list[str]) -> list[str]:
        for ep in v:
            host, _, port = ep.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"endpoint {ep!r} is not host:port")
        return v

    @model_validator(mode="after")
    def _tls_settings(self) -> Deployment:
        tls_keys = ("tls_ca_file", "tls_client_cert_file", "tls_client_key_file", "tls_insecure_skip_verify")
        if not self.tls and any(getattr(self, k) for k in tls_keys):
            raise ValueError(f"{next(k for k in tls_keys if getattr(self, k))} needs tls: true")
        if bool(self.tls_client_cert_file) != bool(self.tls_client_key_file):
            raise ValueError("tls_client_cert_file and tls_client_key_file go together (both or neither)")
        if self.tls_insecure_skip_verify and self.tls_ca_file:
            raise ValueError("tls_insecure_skip_verify and tls_ca_file contradict each other: pick one")
        if self.health_check and (self.health_check.grpc_service is not None) != (self.protocol == "kserve-grpc"):
            raise ValueError("health_check: a kserve-grpc deployment is checked with grpc_service, any other "
                             "with http_path")
        for proto, section in CLOUD_SECTIONS.items():
            if (getattr(self, section) is not None) != (self.protocol == proto):
                raise ValueError(f"protocol {proto} needs a `{section}:` section" if self.protocol == proto
                                 else f"`{section}:` is for protocol {proto}, not {self.protocol}")
        if self.replica_metrics is not None:
            if self.protocol in CLOUD_SECTIONS:
                raise ValueError(f"replica_metrics: a {self.protocol} deployment has no replicas to read")
            named = [ep for ep in self.endpoints if not _ip_literal(ep.rpartition(":")[0])]
            if named:  # Envoy's override-host matches the resolved IP:port, not a name
                raise ValueError(f"replica_metrics needs IP endpoints, not {named[0]!r}")
        if self.batch is not None and self.batch.mode == "native" and self.protocol not in NATIVE_BATCH_PROTOCOLS:
            raise ValueError(f"batch: native batches run on openai, anthropic and bedrock deployments, "
                             f"not {self.protocol}")
        if self.batch is not None and self.batch.mode == "native" and self.protocol == "bedrock" \
                and not (self.batch.bucket and self.batch.role_arn):
            raise ValueError("batch: a native batch on bedrock needs `bucket` and `role_arn` (its job reads and "
                             "writes S3)")
        if self.batch is not None and self.batch.mode == "native" and self.protocol == "vertex" \
                and not (self.batch.bucket and self.vertex is not None and self.vertex.publisher == "google"):
            raise ValueError("batch: a native batch on vertex needs `bucket` (its job reads and writes Cloud "
                             "Storage) and a Gemini model (publisher google)")
        if self.warmup and self.protocol in CLOUD_SECTIONS:  # a warm-up call would need the cloud's credentials
            raise ValueError(f"warmup: not available for protocol {self.protocol}")
        if unknown := sorted(set(self.lb.weights) - set(self.endpoints)):
            raise ValueError(f"lb.weights names {', '.join(unknown)}, not in endpoints")
        if self.scale_from_zero is not None and (not self.max_inflight or self.health_check is None):
            # Callers are held in the deployment's queue; readiness is its health check (HTTP or gRPC).
            raise ValueError("scale_from_zero needs max_inflight (its queue holds the callers) and a "
                             "health_check (http_path or grpc_service: it says when a replica is ready)")
        return self

    def credential(self) -> str | None:
        """The provider key to inject upstream, read fresh so rotated files take effect."""
        if self.api_key_env:
            return os.environ.get(self.api_key_env) or None
        if self.api_key_file:
            try:
                return Path(self.api_key_file).read_text().strip() or None
            except OSError:
                return None
        return None


def _chat_only() -> list[TaskType]:
    return ["chat"]


class ModelConfig(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.:/-]+$")
    groups: list[str] = Field(default_factory=list)
    task_types: list[TaskType] = Field(default_factory=_chat_only)
    capabilities: Capabilities = Capabilities()
    quality: float = Field(0.5, ge=0, le=1)
    latency_ms: float = Field(500.0, ge=0)
    cost: Cost = Cost()
    owned_by: str = "modelyard"
    vision: VisionConfig | None = None
    batching: BatchingConfig | None = None
    # The default for this model's deployments (each may set its own): contracts/params.py.
    drop_params: DropParams = None
    cache: CachePolicy | None = None  # the response cache (docs/cache.md); absent: never cached
    deployments: list[Deployment] = Field(min_length=1)

    _drop_params = field_validator("drop_params")(check_drop_params)

    @model_validator(mode="after")
    def _embedding_protocols(self) -> ModelConfig:
        # adapters.embeddings.EMBEDDING_PROTOCOLS, kept literal so config does not import NumPy.
        if "embedding" in self.task_types:
            for d in self.deployments:
                if d.protocol not in ("openai", "gemini"):
                    raise ValueError(f"deployment {d.cluster!r}: a {d.protocol} upstream cannot serve embeddings "
                                     "(openai or gemini)")
        return self

    @model_validator(mode="after")
    def _kserve_deployments(self) -> ModelConfig:
        """A KServe deployment the router could never pick, or pick for the wrong protocol, is a
        config mistake: refused at load with its key path rather than found by a caller."""
        kserve = [i for i, d in enumerate(self.deployments) if d.protocol in KSERVE_PROTOCOLS]
        if not kserve:
            return self
        if len(kserve) != len(self.deployments):
            other = next(i for i in range(len(self.deployments)) if i not in kserve)
            raise ValueError(f"deployments[{other}].protocol: {self.deployments[other].protocol} next to KServe "
                             f"deployments[{kserve[0]}]: a model's deployments are all KServe v2 or none")
        if not {"infer", "image-classification"} & set(self.task_types):
            raise ValueError(f"task_types: a KServe model (deployments[{kserve[0]}]) needs infer and/or "
                             "image-classification")
        if "image-classification" in self.task_types and self.vision is None:
            raise ValueError("vision: image-classification needs the model's vision section (input, labels)")
        return self


class AuditCapture(_Model):
    """A tenant's request and response bodies in its audit rows: redacted, then capped."""

    capture_bodies: bool = False
    max_body_bytes: int = Field(4096, ge=1, le=1024 * 1024)
    # Matches become [REDACTED]; credential fields and key-shaped strings are always redacted.
    redact: list[str] = Field(default_factory=list)

    @field_validator("redact")
    @classmethod
    def _compiles(cls, v: list[str]) -> list[str]:
        for i, pattern in enumerate(v):
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"redact[{i}] is not a valid regex: {e}") from None
        return v


class TenantConfig(_Model):
    name: str
    tier: Tier = "L3"
    # sha256 hex digests of the tenant's API keys; plaintext keys never live in config.
    api_keys: list[str] = Field(min_length=1)
    allowed_models: list[str] = Field(default_factory=lambda: ["*"])
    strategy: str = "balanced"
    audit: AuditCapture = AuditCapture()
    # Env var holding the HMAC-SHA256 key that signs this tenant's task webhooks (none: not sent).
    webhook_secret_env: str | None = None
    budget: Budget | None = None  # the tenant's spend cap, over all its keys

    @field_validator("api_keys")
    @classmethod
    def _hashed(cls, v: list[str]) -> list[str]:
        return sha256_digests(v, "api_keys")

    def may_use(self, model: str) -> bool:
        return "*" in self.allowed_models or model in self.allowed_models


class DemoKubeApi(_Model):
    """The demo Kubernetes API `up` runs at `endpoint_picker.kubernetes.api_server` (devstack/demo/kube_api.py):
    the pool's InferencePool target ports and its pods (name -> IP), all Running and Ready at the start."""

    target_ports: list[int] = Field(min_length=1)
    pods: dict[str, str] = Field(default_factory=dict)


class DevStackConfig(_Model):
    """What `modelyard up` starts and where it writes (docs/operations.md); the extproc ignores it."""

    # Clusters that `up` serves with demo servers of its own (and a fake GPU agent for a watermark
    # URL on this host); every other cluster is yours to run. No name implies it.
    demo_upstreams: list[str] = Field(default_factory=list)
    # `mcp_servers` (by name, a url on this host) that `up` serves with its demo MCP server.
    demo_mcp_servers: list[str] = Field(default_factory=list)
    # `up` runs the demo OAuth authorization server at `mcp.oauth.issuer` (devstack/demo/oauth_server.py).
    demo_oauth: bool = False
    # `up` runs a demo Kubernetes API for the endpoint picker's pool (endpoint_picker.kubernetes.api_server).
    demo_kube_api: DemoKubeApi | None = None
    # Logs, the rendered Envoy config and its admin address; a relative path is under the config
    # file's directory (`up --run-dir` overrides it).
    run_dir: str = "run"
    # Envoy's admin port; None keeps the environment file's, 0 takes a free one (`up --admin-port`).
    admin_port: int | None = Field(None, ge=0, le=65535)


class GatewayConfig(_Model):
    listener: ListenerConfig = ListenerConfig()
    extproc: ExtprocConfig = ExtprocConfig()
    models: list[ModelConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(min_length=1)
    # Feature sections: models owned by their own modules (routing, ratelimit), parsed here once.
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    ratelimit: RateLimitConfig = Field(default_factory=RateLimitConfig)
    devstack: DevStackConfig = Field(default_factory=DevStackConfig)
    keys: KeysConfig = Field(default_factory=KeysConfig)
    controlplane: ControlPlaneConfig = Field(default_factory=ControlPlaneConfig)
    response_cache: ResponseCacheStore = Field(default_factory=ResponseCacheStore)
    # `modelyard epp`: the replica picker as an Inference Extension endpoint picker (docs/routing.md)
    endpoint_picker: EndpointPickerConfig | None = None
    # MCP servers behind /mcp, and who may call which tool (contracts/config/mcp.py, docs/mcp.md).
    mcp_servers: list[McpServer] = Field(default_factory=list)
    mcp: McpSettings = Field(default_factory=McpSettings)
    guardrails: GuardrailsConfig = Field(default_factory=GuardrailsConfig)  # docs/guardrails.md
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)  # the operator's console (docs/console.md)

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        _no_duplicates([m.name for m in self.models], "models", "name")
        _no_duplicates([t.name for t in self.tenants], "tenants", "name")
        _no_duplicates([s.name for s in self.mcp_servers], "mcp_servers", "name")
        protocols: dict[str, str] = {}
        for m in self.models:
            for d in m.deployments:
                if protocols.setdefault(d.cluster, d.protocol) != d.protocol:
                    raise ValueError(f"cluster {d.cluster!r} is used with two protocols")
        return self

    @model_validator(mode="after")
    def _semantic_cache_embedders(self) -> GatewayConfig:
        check_embedding_models(self.models)  # docs/cache.md: a semantic policy's embedder is served here
        return self

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

    def unverified_tls_clusters(self) -> list[str]:
        """Clusters whose upstream certificate nobody checks (`tls_insecure_skip_verify`)."""
        return [name for name, d in self.clusters().items() if d.tls and d.tls_insecure_skip_verify]

    def clusters(self) -> dict[str, Deployment]:
        """One entry per upstream cluster (deployments may share a cluster across models)."""
        out: dict[str, Deployment] = {}
        for m in self.models:
            for d in m.deployments:
                out.setdefault(d.cluster, d)
        return out


def _no_duplicates(names: list[str], section: str, key: str) -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            raise ValueError(f"{section}[{i}].{key}: duplicate {n!r}")
        seen.add(n)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ""
        for part in e["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        lines.append(f"{path or '<root>'}: {e['msg']}")
    return "; ".join(lines)


def parse_config(data: Any, source: str = "<config>") -> GatewayConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        cfg = GatewayConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {_format_error(e)}") from None
    _check_references(cfg, source)
    return cfg


def _check_references(cfg: GatewayConfig, source: str) -> None:
    """Names one section uses and another defines; checked at load so every command (serve, up,
    envoy render, route explain) refuses the file alike, not only the one that builds a Scheduler."""
    strategies = cfg.routing.strategies
    for i, t in enumerate(cfg.tenants):
        if t.strategy not in strategies:
            known = ", ".join(sorted(strategies))
            raise ConfigError(f"{source}: tenants[{i}].strategy: unknown strategy {t.strategy!r} (known: {known})")
    tenants = {t.name for t in cfg.tenants}
    for i, a in enumerate(cfg.mcp.access):
        if a.tenant is not None and a.tenant not in tenants:
            raise ConfigError(f"{source}: mcp.access[{i}].tenant: unknown tenant {a.tenant!r}")
    for i, o in enumerate(cfg.mcp.oauth.subjects if cfg.mcp.oauth is not None else []):
        if o.tenant not in tenants:
            raise ConfigError(f"{source}: mcp.oauth.subjects[{i}].tenant: unknown tenant {o.tenant!r}")
    _check_guardrail_references(cfg, source)
    _check_learning_references(cfg, source)


def _check_learning_references(cfg: GatewayConfig, source: str) -> None:
    """routing.adaptive.models and routing.breakers[].model naming a model the file does not define: a
    warning, as for guardrail policies (a model may leave by reload first); such an entry does nothing."""
    models = {m.name for m in cfg.models}
    named = [(f"routing.adaptive.models[{i}]", n) for i, n in enumerate(cfg.routing.adaptive.models)]
    named += [(f"routing.breakers[{i}].model", b.model) for i, b in enumerate(cfg.routing.breakers) if b.model]
    named += [(f"routing.share_breakers[{i}].models[{j}]", n) for i, b in enumerate(cfg.routing.share_breakers)
              for j, n in enumerate(b.models or ())]
    groups = {g for m in cfg.models for g in m.groups} | {"auto"}
    for i, b in enumerate(cfg.routing.share_breakers):
        if b.group is not None and b.group not in groups:
            logging.getLogger("modelyard.config").warning(
                "%s: routing.share_breakers[%d].group: %r is no model group in this file (it breaks nothing)",
                source, i, b.group)
    for where, name in named:
        if name not in models:
            logging.getLogger("modelyard.config").warning(
                "%s: %s: %r is not defined in this file (nothing to learn or break for it)", source, where, name)


def _check_guardrail_references(cfg: GatewayConfig, source: str) -> None:
    """A policy naming a tenant or model the file does not define: a warning, not a refusal (a tenant
    may leave by reload before its policy does), so a misspelt name is still seen in the log."""
    tenants, models = {t.name for t in cfg.tenants}, {m.name for m in cfg.models}
    for i, p in enumerate(cfg.guardrails.policies):
        for kind, names, known in (("tenants", p.applies_to.tenants, tenants), ("models", p.applies_to.models, models)):
            for name in names:
                if name not in known:
                    logging.getLogger("modelyard.config").warning(
                        "%s: guardrails.policies[%d].applies_to.%s: %r is not defined in this file (the policy "
                        "does not cover it)", source, i, kind, name)


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    return Path(explicit or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def load_config(path: str | os.PathLike[str] | None = None) -> GatewayConfig:
    p = config_path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(f"{p}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({e})") from None
    return parse_config(data, str(p))
