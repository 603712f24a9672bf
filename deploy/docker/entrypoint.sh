#!/bin/sh
# The image's entry point: one role per container.
#   envoy            Envoy with /etc/modelyard/envoy.yaml ($ENVOY_CONFIG), rendered by `modelyard envoy render`
#   extproc          the ext_proc gRPC service with /etc/modelyard/modelyard.yaml ($MODELYARD_CONFIG)
#   controlplane [args]  `modelyard controlplane` with /etc/modelyard/modelyard.yaml, listening on
#                    $MODELYARD_CONTROLPLANE_BIND (0.0.0.0) at the ports of controlplane.xds_address/api_address
#   epp [args]       `modelyard epp` (the Inference Extension endpoint picker) with /etc/modelyard-epp/epp.yaml
#                    ($MODELYARD_EPP_CONFIG)
#   agent [args]     the GPU watermark agent on 0.0.0.0:8301 (add --fake where there is no GPU)
#   demo KIND [args] a demo upstream (openai|anthropic|gemini|kserve)
#   healthcheck      the HEALTHCHECK: probes the role this container was started with (modelyard.probe)
#   anything else    run as a command (`modelyard hash-key ...`, `sh`)
set -eu

ROLE_FILE="${MODELYARD_ROLE_FILE:-/tmp/modelyard-role}"
role="${1:-extproc}"
[ "$#" -gt 0 ] && shift

if [ "$role" = healthcheck ]; then
  started="$(cat "$ROLE_FILE" 2>/dev/null || echo unknown)"
  case "$started" in
    envoy) exec python -m modelyard.probe http "http://127.0.0.1:${MODELYARD_LISTENER_PORT:-10000}/v2/health/live" ;;
    extproc) exec python -m modelyard.probe grpc "127.0.0.1:${MODELYARD_EXTPROC_PORT:-50051}" ;;
    controlplane) exec python -m modelyard.probe http \
      "http://127.0.0.1:${MODELYARD_CONTROLPLANE_API_PORT:-18001}/v1/status" ;;
    epp) exec python -m modelyard.probe grpc "127.0.0.1:${MODELYARD_EPP_PORT:-9002}" ;;
    agent) exec python -m modelyard.probe http "http://127.0.0.1:${MODELYARD_AGENT_PORT:-8301}/watermarks" ;;
    demo) exec python -m modelyard.probe tcp "127.0.0.1:${MODELYARD_DEMO_PORT:-8101}" ;;
    *) exit 0 ;;  # a one-off command: nothing to probe
  esac
fi

# A read-only root filesystem (Kubernetes) has no /tmp unless mounted: the probe then has no role.
echo "$role" > "$ROLE_FILE" 2>/dev/null || true
case "$role" in
  envoy)
    exec envoy -c "${ENVOY_CONFIG:-/etc/modelyard/envoy.yaml}" --concurrency "${ENVOY_CONCURRENCY:-2}" \
      --disable-hot-restart "$@" ;;
  extproc) exec modelyard serve --config "${MODELYARD_CONFIG:-/etc/modelyard/modelyard.yaml}" "$@" ;;
  controlplane) exec modelyard controlplane --config "${MODELYARD_CONFIG:-/etc/modelyard/modelyard.yaml}" \
    --bind "${MODELYARD_CONTROLPLANE_BIND:-0.0.0.0}" "$@" ;;
  epp) exec modelyard epp --config "${MODELYARD_EPP_CONFIG:-/etc/modelyard-epp/epp.yaml}" "$@" ;;
  agent) exec modelyard agent --host 0.0.0.0 "$@" ;;
  demo) exec modelyard demo "$@" ;;
  *) exec "$role" "$@" ;;
esac
