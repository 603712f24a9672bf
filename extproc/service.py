"""The composition root: the route table, the gateway's parts from config, and the service's run.

The only module that knows every flow: it puts them in the route table the sessions get.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from adapters import embeddings, kserve, kserve_grpc, media
from adapters.registry import detect_client_protocol, gemini_action
from contracts.config import GatewayConfig, config_path, load_config
from contracts.errors import ConfigError, ModelyardError
from contracts.live_config import config_version
from contracts.workers import shifted, worker_count, worker_socket
from extproc.admission.budget_guard import BudgetGuard
from extproc.admission.concurrency import ConcurrencyLimits
from extproc.admission.shared_evidence import SharedEvidence
from extproc.admission.waking import Waker
from extproc.batches.desk import BatchDesk
from extproc.cache.part import ResponseCache
from extproc.context import ClientProtocol
from extproc.flows import batches, console, feedback, keys_admin, local, mcp, tasks
from extproc.flows.body_answer import BodyAnswer
from extproc.flows.chat import ChatFlow
from extproc.flows.completions import CompletionsFlow
from extproc.flows.embeddings import EmbeddingFlow
from extproc.flows.kserve_grpc import GrpcInferFlow, answer_on_extproc
from extproc.flows.kserve_grpc import add_to_server as add_kserve_answers
from extproc.flows.media import MediaFlow
from extproc.flows.vision import ClassifyFlow, KServeInferFlow
from extproc.flows.xlate import XlateFlow
from extproc.gateway import Gateway, LiveGateway
from extproc.key_admin import KeyAdmin
from extproc.live.config_feed import ConfigFeed, worker_id
from extproc.live.reload import Outcome, Reloader, show_version
from extproc.replicas.board import ReplicaBoard
from extproc.routes import Route, RouteTable
from extproc.routing import Scheduler
from extproc.server import ExtprocServer
from extproc.tasks.board import TaskBoard
from extproc.telemetry.audit import AuditLog
from extproc.telemetry.demand import DEMAND
from extproc.telemetry.metering import DecisionRecord, MeteringStore
from extproc.telemetry.metrics import (
    DEPLOYMENT_STATES,
    IMAGE_BACKEND,
    LATENCY_OBJECTIVES,
    LEARNING_STATE,
    serve_metrics,
)
from extproc.telemetry.pollers import WatermarkBoard
from extproc.telemetry.warmup import Warmer
from extproc.vision.batching import Batcher
from extproc.workers import WORKER_ENV, WorkerPool, shared_dir, worker_index
from kernels import select_backend
from keys.cache import KeyCache
from keys.location import store_dsn
from ratelimit import Decision, Limiter
from ratelimit import RequestContext as RateLimitContext
from ratelimit import status as ratelimit_status
from ratelimit.rls import DecisionHook, add_to_server

if TYPE_CHECKING:  # an optional extra: imported below only when tracing is configured
    from extproc.telemetry.tracing import Tracing

log = logging.getLogger("modelyard.service")

# Public (no key): probes and load balancers ask them; the server's own, not any model's.
_V2_PUBLIC = {"/v2": local.v2_server_metadata, "/v2/": local.v2_server_metadata,
              "/v2/health/live": local.v2_live, "/v2/health/ready": local.v2_ready}
_OPENAI_MODEL_PREFIX = "/v1/models/"


def _openai_models(method: str, path: str) -> Route | None:
    if method != "GET":
        return None
    # OpenAI's path and Anthropic's: the key in either protocol's header, the answer in the asker's shape.
    if path == "/v1/models":
        return Route("openai", any_key=True, answer=local.list_models_any)
    if path.startswith(_OPENAI_MODEL_PREFIX) and "/" not in path[len(_OPENAI_MODEL_PREFIX):]:
        return Route("openai", any_key=True, path_model=unquote(path[len(_OPENAI_MODEL_PREFIX):]),
                     answer=local.get_model_any)
    return None


_GEMINI_MODEL_PREFIX = "/v1beta/models/"


def _gemini_models(method: str, path: str) -> Route | None:
    if method != "GET":
        return None
    if path == "/v1beta/models":
        return Route("gemini", answer=local.gemini_list_models)
    name = path[len(_GEMINI_MODEL_PREFIX):] if path.startswith(_GEMINI_MODEL_PREFIX) else ""
    if name and "/" not in name and ":" not in name:
        return Route("gemini", path_model=unquote(name), answer=local.gemini_get_model)
    return None


def _media(method: str, path: str) -> Route | None:
    # /v1/images/generations|edits, /v1/audio/*: passed through to OpenAI-shaped deployments (docs/media.md).
    endpoint = media.ENDPOINTS.get(path) if method == "POST" else None
    if endpoint is None:
        return None
    return Route("openai", flow=functools.partial(MediaFlow, endpoint=endpoint), operation=endpoint.kind)


def _feedback(method: str, path: str) -> Route | None:
    if method == "POST" and path == "/v1/feedback":
        return Route("openai", flow=functools.partial(BodyAnswer, handler=feedback.record), operation="feedback")
    return None


def _count_tokens(method: str, path: str) -> Route | None:
    # Anthropic's and the Responses API's token counts: the gateway's own estimate (Gemini's: _gemini_actions).
    if method == "POST" and path == "/v1/messages/count_tokens":
        return Route("anthropic", flow=functools.partial(BodyAnswer, handler=local.count_tokens),
                     operation="count_tokens")
    if method == "POST" and path == "/v1/responses/input_tokens":
        return Route("responses", flow=functools.partial(BodyAnswer, handler=local.responses_input_tokens),
                     operation="count_tokens")
    return None


def _kserve(method: str, path: str) -> Route | None:
    public = _V2_PUBLIC.get(path) if method in ("GET", "HEAD") else None
    if public is not None:
        return Route("kserve", public=True, answer=public)
    try:
        k = kserve.match_path(method, path)
    except ModelyardError:  # a KServe path with the wrong method
        return None
    if k is None:
        return None
    if k.kind == "model_metadata":
        return Route("kserve", path_model=k.model, path_version=k.version, answer=local.v2_model_metadata)
    if k.kind == "model_ready":
        return Route("kserve", path_model=k.model, path_version=k.version, answer=local.v2_model_ready)
    if k.kind == "infer":
        return Route("kserve", path_model=k.model, path_version=k.version, flow=KServeInferFlow,
                     operation=KServeInferFlow.task_type)
    if k.kind == "classify":
        return Route("openai", flow=ClassifyFlow, operation=ClassifyFlow.task_type)
    return None


def _kserve_grpc(method: str, path: str) -> Route | None:
    name = kserve_grpc.method_of(path) if method == "POST" else None
    if name is None:
        return None
    if name == kserve_grpc.INFER:
        return Route("kserve-grpc", flow=GrpcInferFlow, operation=GrpcInferFlow.task_type)
    # Server health and metadata are public, as over REST; model calls need a key.
    return Route("kserve-grpc", public=name.startswith("Server"), answer=answer_on_extproc)


def _embeddings(method: str, path: str) -> Route | None:
    found = embeddings.match_path(method, path)
    if found is None:
        return None
    return Route("openai" if found.shape == "openai" else "gemini", path_model=found.model,
                 flow=functools.partial(EmbeddingFlow, route=found),
                 operation="embeddings")  # GenAI semantic conventions' operation name


def _stored_responses(method: str, path: str) -> Route | None:
    # /v1/responses/{id}[/input_items|/cancel]: the Responses API's stored-state endpoints.
    if path.startswith("/v1/responses/") and len(path) > len("/v1/responses/"):
        return Route("responses", answer=local.stored_response)
    return None


def _tasks(method: str, path: str) -> Route | None:
    if tasks.result_task_id(path) is not None:
        return Route("openai", any_key=True, answer=tasks.get_result) if method == "GET" else None
    if tasks.task_id(path) is None:
        return None
    if method == "GET":
        return Route("openai", any_key=True, answer=tasks.get_task)
    if method == "DELETE":
        return Route("openai", any_key=True, answer=tasks.cancel_task)
    return None


def _keys_admin(method: str, path: str) -> Route | None:
    found = keys_admin.parse_path(method, path)
    if found is None:
        return None
    if found[0] == "create":
        return Route("openai", admin=True, flow=keys_admin.CreateKeyFlow, operation="admin")
    if found[0] == "update":
        return Route("openai", admin=True, flow=keys_admin.UpdateKeyFlow, operation="admin")
    return Route("openai", admin=True, answer=keys_admin.answer, operation="admin")


def _console(method: str, path: str) -> Route | None:
    found = console.matches(method, path)
    if found is None:
        return None
    if found == "post":
        return Route("openai", console=True, flow=console.ConsoleFlow, operation="admin")
    return Route("openai", console=True, answer=console.answer, operation="admin")


def _mcp(method: str, path: str) -> Route | None:
    if method == "GET" and path.startswith(mcp.METADATA_PREFIX):  # OAuth resource metadata: public
        return Route("mcp", public=True, answer=mcp.resource_metadata, operation="mcp")
    if path not in mcp.PATHS:
        return None
    if method == "POST":
        return Route("mcp", flow=mcp.McpFlow, operation="mcp")
    if method == "GET":
        return Route("mcp", answer=mcp.listen, operation="mcp")
    return Route("mcp", answer=mcp.end_session if method == "DELETE" else mcp.not_allowed, operation="mcp")


def _batches(method: str, path: str) -> Route | None:
    # Files, batches and message batches (docs/batches.md): answered by the gateway, no upstream.
    found = batches.parse_path(method, path)
    if found is None:
        return None
    protocol: ClientProtocol = "anthropic" if path.startswith(batches.MESSAGE_BATCHES) else "openai"
    handler = batches.BODY_HANDLERS.get(found[0])
    if handler is not None:
        return Route(protocol, flow=functools.partial(BodyAnswer, handler=handler), operation="batch")
    return Route(protocol, answer=batches.answer, operation="batch")


def _chat(method: str, path: str) -> Route | None:
    client = detect_client_protocol(method, path)
    if client is None:
        return None
    if client.protocol == "completions":  # /v1/completions (flows/completions.py); a translation hop cannot re-render it
        return Route("completions", flow=CompletionsFlow, operation="text_completion")
    return Route(client.protocol, path_model=client.model, stream=client.stream, translatable=True, flow=ChatFlow)


def _gemini_actions(method: str, path: str) -> Route | None:
    # Gemini's model actions past generation and embeddings: countTokens answered here, any other a 404
    # in Gemini's shape (after _chat and _embeddings, which claim theirs).
    found = gemini_action(path) if method == "POST" else None
    if found is None:
        return None
    if found[1] == "countTokens":
        return Route("gemini", path_model=found[0], flow=functools.partial(BodyAnswer, handler=local.gemini_count_tokens),
                     operation="count_tokens")
    return Route("gemini", public=True, answer=local.not_found)


def build_routes() -> RouteTable:
    """Every endpoint the gateway serves, in match order; anything else is a 404."""
    return RouteTable([_openai_models, _tasks, _kserve, _kserve_grpc, _embeddings, _count_tokens, _stored_responses,
                       _keys_admin, _console, _batches, _gemini_models, _feedback, _media, _mcp, _chat,
                       _gemini_actions],
                      fallback=Route("openai", public=True, answer=local.not_found), hop=XlateFlow)


def build_gateway(config: GatewayConfig, config_file: Path | None = None) -> Gateway:
    """The parts from config; with `config_file`, the key store too (its default place is beside it)."""
    try:
        shared = shared_dir()  # one of several workers: the buckets are the host's, not this process's
        limiter = Limiter(config.ratelimit, host_table=None if shared is None else f"{shared}/buckets")
        scheduler = Scheduler(config)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    board = WatermarkBoard.from_config(config, scheduler.settings.watermarks.interval_s)
    metering = MeteringStore(config.extproc.metering_db) if config.extproc.metering_db else None
    audit = AuditLog.from_config(config)
    # Image preprocessing: CuPy when a device is present (or asked for), else NumPy.
    backend = select_backend(config.extproc.image_backend)
    IMAGE_BACKEND.labels(backend.name).set(1)
    log.info("image preprocessing backend: %s (preference %s)", backend.name, config.extproc.image_backend)
    # max_inflight is the host's when several workers serve it (extproc/admission/host_slots.py)
    # ... and every replica's with the Redis backend (extproc/admission/redis_slots.py)
    rl = config.ratelimit
    limits = ConcurrencyLimits(config, host=None if shared is None else (f"{shared}/slots", worker_index()),
                               redis_url=rl.redis.url if rl.backend == "redis" else None,
                               workers=1 if shared is None else worker_count(config.extproc.workers))
    key_admin, dsn = None, None
    if config_file is not None:
        dsn = store_dsn(config, config_file)
        key_admin = KeyAdmin(config, dsn, KeyCache(), audit)
    tasks_board = TaskBoard.from_config(config)
    budgets = BudgetGuard.from_config(config, dsn)
    batch_desk = BatchDesk(config.extproc.batches, tasks_board, config=config, metering=metering, budgets=budgets) \
        if config.extproc.batches is not None and tasks_board is not None else None
    return Gateway.build(config, scheduler=scheduler, limiter=limiter, watermarks=board, batcher=Batcher(),
                         image_backend=backend, metering=metering, tracing=build_tracing(config), audit=audit,
                         tasks=tasks_board, limits=limits, budgets=budgets,
                         key_admin=key_admin, replicas=ReplicaBoard(list(config.clusters().values())),
                         response_cache=ResponseCache.from_config(config), batches=batch_desk)


def build_tracing(config: GatewayConfig) -> Tracing | None:
    """OpenTelemetry when `extproc.tracing` is set; None (and nothing of it imported) otherwise."""
    settings = config.extproc.tracing
    if settings is None:
        return None
    try:
        from extproc.telemetry.tracing import Tracing
    except ImportError:
        raise ConfigError("extproc.tracing needs the tracing extra: pip install 'modelyard[tracing]'") from None
    # The host only: a URL's user-info part could hold a collector credential.
    where = urlsplit(settings.endpoint).netloc.rpartition("@")[2]
    log.info("tracing: OTLP %s to %s (sampling %g)", settings.protocol, where, settings.sample_ratio)
    return Tracing(settings)


async def reload_from_file(reloader: Reloader, path: str | None) -> Outcome:
    """SIGHUP: re-read the config file and apply all of it atomically (extproc/live/reload.py), or none of it."""
    return await reloader.reload_file(config_path(path))


def running_version(path: str | None) -> str:
    """The version of the file this process loaded at start (read once, before serving)."""
    try:
        return config_version(config_path(path).read_bytes())
    except OSError:
        return ""


async def run_service(config: GatewayConfig, *, path: str | None = None, metrics: bool = True,
                      pool: WorkerPool | None = None) -> None:
    log.info("event loop: %s", type(asyncio.get_running_loop()).__module__.partition(".")[0])
    gateway = build_gateway(config, config_path(path))
    live = LiveGateway(gateway, running_version(path))
    show_version("", live.version)
    # /metrics first: the gRPC port accepts connections from the moment it is bound (below), and whoever
    # takes that for "up" (a supervisor, the devstack launcher) may read /metrics at once.
    if metrics and config.extproc.metrics_address:
        DEPLOYMENT_STATES.source = lambda: live.current.dispatcher.deployment_states()
        DEMAND.clusters = lambda: iter(live.current.dispatcher.scheduler.config.clusters())
        DEMAND.loads = lambda: live.current.dispatcher.limits.loads()
        LATENCY_OBJECTIVES.source = lambda: live.current.dispatcher.scheduler.latency.exposition(time.monotonic())
        LEARNING_STATE.source = lambda: live.current.dispatcher.scheduler.learning_state(time.monotonic())
        serve_metrics(config.extproc.metrics_address)
    limiter = gateway.dispatcher.limiter
    # Envoy's native ratelimit filter (staging env) asks the same buckets on the same port.
    server = ExtprocServer(config, live, build_routes())
    add_kserve_answers(server.services, live)  # gRPC ingress calls answered without an inference
    if limiter is not None:  # the limiter lives across reloads (bucket levels): its rules are swapped
        add_to_server(server.services, limiter, _rls_decisions(gateway))
        ratelimit_status.add_to_server(server.services, limiter)  # `modelyard ratelimit status`
    warmer = Warmer(config, gateway.dispatcher.scheduler)
    waker = Waker(config, lambda: live.current.dispatcher.limits)  # scale_from_zero: held until a replica is ready
    reloader = Reloader(live, warmer, waker)
    reloads: set[asyncio.Task[Outcome]] = set()
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _reload_all, pool, reloader, path, reloads)
    # Pollers run in the background; the first readings are in before traffic is accepted.
    if gateway.watermarks is not None:
        await gateway.watermarks.start(first_poll_timeout=2.0)
    if gateway.replicas is not None:
        await gateway.replicas.start(first_poll_timeout=1.0)
    if gateway.key_admin is not None:  # the store's keys are in before traffic is accepted (or a bounded wait)
        gateway.key_admin.refresher.start()
        if not await asyncio.to_thread(gateway.key_admin.refresher.wait_loaded, 5.0):
            log.error("key store not read: serving config-file keys; store keys follow once it answers")
    warmer.start()  # before serving: the first requests already see which deployments are warming
    await waker.start()
    shared_evidence = None
    if config.routing.adaptive.store == "redis":  # the learning strategy's evidence, shared by every replica
        rc = config.ratelimit.redis
        shared_evidence = SharedEvidence(rc.url, lambda: live.current.dispatcher.scheduler.bandit,
                                         prefix=rc.key_prefix, timeout_ms=rc.timeout_ms)
        shared_evidence.start()
    feed = None
    if config.controlplane.enabled:  # the control plane's config, long-polled, applied as SIGHUP's is
        feed = ConfigFeed(config.controlplane.api_address, reloader, worker_id(worker_index()))
        feed.start()
    try:
        await server.serve_until_signal(on_stop=pool.stop_async if pool is not None else None)
    finally:
        if feed is not None:
            await feed.close()
        await asyncio.gather(*reloads, return_exceptions=True)
        await warmer.close()
        await waker.close()
        if shared_evidence is not None:
            await shared_evidence.close()


def _rls_decisions(gateway: Gateway) -> DecisionHook | None:
    """Envoy's ratelimit filter decisions (`enforce: envoy`) into the metering store's decisions
    table, as the extproc's own are: the tuner sees the whole demand either way."""
    metering, limiter = gateway.accountant.metering, gateway.dispatcher.limiter
    if metering is None or limiter is None:
        return None

    def record(ctx: RateLimitContext, requests: int, tokens: int, d: Decision) -> None:
        metering.record_decision(DecisionRecord(
            time.time(), "", ctx.tenant or "", ctx.tier or "", ctx.cluster or "", ctx.channel or "", "",
            d.allowed, requests, tokens, d.limited_by, limiter.bound_rule(ctx, d), d.store))
    return record


def _reload_all(pool: WorkerPool | None, reloader: Reloader, path: str | None,
                reloads: set[asyncio.Task[Outcome]]) -> None:
    """SIGHUP: every worker reloads the whole config, not only the one the signal reached."""
    if pool is not None:
        pool.signal(signal.SIGHUP)
    task = asyncio.get_running_loop().create_task(reload_from_file(reloader, path))
    reloads.add(task)
    task.add_done_callback(reloads.discard)


def warn_unverified_tls(config: GatewayConfig) -> None:
    """Said at every start, not only at render: an unverified upstream must not go unnoticed."""
    for cluster in config.unverified_tls_clusters():
        log.warning("deployment %s: upstream TLS certificate is NOT verified (tls_insecure_skip_verify)", cluster)


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when asked for and installed; None (asyncio's default loop) otherwise."""
    if choice != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        log.warning("extproc.event_loop is uvloop but uvloop is not installed; using asyncio's loop")
        return None
    return uvloop.new_event_loop


def serve(path: str | None, worker: int | None = None) -> int:
    """Run the service; with `extproc.workers` > 1, as worker 0 of a pool it starts (`worker`: None),
    or as worker `worker` of one."""
    config = load_config(path)
    count = worker_count(config.extproc.workers)
    if worker is not None or count > 1:
        i = worker or 0
        os.environ[WORKER_ENV] = str(i)
        config = config.model_copy(update={"extproc": config.extproc.model_copy(update={
            "address": shifted(config.extproc.address, i),
            "unix_socket": worker_socket(config.extproc.unix_socket, i),
            "metrics_address": shifted(config.extproc.metrics_address, i)})})
    if worker is None:
        warn_unverified_tls(config)
    pool = WorkerPool.start(path, load_config(path).extproc.address, count) if worker is None and count > 1 else None
    if pool is not None:  # a worker that cannot start at all stops serve: SIGTERM to itself, drained
        pool.on_failure = lambda: os.kill(os.getpid(), signal.SIGTERM)
    try:
        with asyncio.Runner(loop_factory=loop_factory(config.extproc.event_loop)) as runner:
            runner.run(run_service(config, path=path, pool=pool))
    finally:
        if pool is not None:
            pool.stop()
    return 1 if pool is not None and pool.failure else 0
