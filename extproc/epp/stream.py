"""One ext_proc stream of the endpoint picker: `ProcessingRequest` in, the replies to send out.

Full duplex (the protocol's FULL_DUPLEX_STREAMED request body): the request-headers reply waits
until the body has arrived, because the pick reads the body (model, prompt); then the headers reply
carries the endpoint (header `x-gateway-destination-endpoint`, dynamic metadata `envoy.lb`) and
the body goes back whole as a streamed body reply. Response bodies (FULL_DUPLEX_STREAMED too) pass
through chunk by chunk. No I/O: the board's pick reads the last readings.
"""

from __future__ import annotations

from collections.abc import Mapping

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import json_format

from contracts.config.endpoint_picker import EndpointPickerConfig
from contracts.errors import ClientError, ModelyardError
from extproc import messages as msg
from extproc.epp import decision
from extproc.errors import error_response
from extproc.replicas.board import ReplicaBoard, Sent
from extproc.telemetry.metrics import EPP_DECISIONS


def _metadata(req: pb.ProcessingRequest, namespace: str) -> dict[str, object] | None:
    fm = req.metadata_context.filter_metadata
    return json_format.MessageToDict(fm[namespace]) if namespace in fm else None


class EppStream:
    def __init__(self, config: EndpointPickerConfig, board: ReplicaBoard,
                 objectives: Mapping[str, int] | None = None) -> None:
        self.config = config
        self.board = board
        self.objectives = objectives  # None: the config's
        self.headers: dict[str, str] = {}
        self.hint: list[str] | None = None
        self.body = bytearray()
        self.sent: Sent | None = None
        self.failed = False
        self.served: str | None = None  # the endpoint that answered, when the proxy says
        self.done = False  # the request is answered (an immediate reply ends the stream's work)

    def handle(self, req: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if self.done:
            return []
        try:
            return self._handle(req)
        except ModelyardError as e:
            self.done = True
            outcome = {503: "no_ready", 429: "shed"}.get(e.status, "bad_request")
            EPP_DECISIONS.labels(self.config.pool, outcome).inc()
            return [error_response("openai", e)]

    def _handle(self, req: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = req.WhichOneof("request")
        if kind == "request_headers":
            self.headers = msg.header_map(req.request_headers)
            sub = _metadata(req, decision.SUBSET_NAMESPACE)
            self.hint = decision.subset_hint({decision.SUBSET_NAMESPACE: sub}) if sub is not None else None
            if req.request_headers.end_of_stream:  # no body (a GET): a pick without a prompt
                return [self._route(decision.InferenceAsk(None, None), None)]
            return []
        if kind == "request_body":
            part = req.request_body
            if len(self.body) + len(part.body) > self.config.max_body_bytes:
                raise ClientError(f"request body over {self.config.max_body_bytes} bytes", status=413)
            self.body += part.body
            if not part.end_of_stream:
                return []
            body, self.body = bytes(self.body), bytearray()  # not held while the answer streams
            return [self._route(decision.read_body(body), len(body)), msg.streamed_body("request_body", body, end=True)]
        if kind == "request_trailers":  # the body's end came as trailers
            body, self.body = bytes(self.body), bytearray()
            out = [self._route(decision.read_body(body), len(body))]
            if body:
                out.append(msg.streamed_body("request_body", body, end=False))
            r = pb.ProcessingResponse()
            r.request_trailers.SetInParent()
            return [*out, r]
        if kind == "response_headers":
            status = msg.header_map(req.response_headers).get(":status", "200")
            self.failed = not status.isdigit() or int(status) >= 500
            served = (_metadata(req, decision.DESTINATION_NAMESPACE) or {}).get(decision.SERVED_KEY)
            self.served = served if isinstance(served, str) else None
            if req.response_headers.end_of_stream:
                self._finish()
            return [msg.response_headers()]
        if kind == "response_body":
            if req.response_body.end_of_stream:
                self._finish()
            return [msg.streamed_body("response_body", req.response_body.body, req.response_body.end_of_stream)]
        if kind == "response_trailers":
            self._finish()
            return [msg.response_trailers()]
        return []

    def _route(self, ask: decision.InferenceAsk, content_length: int | None) -> pb.ProcessingResponse:
        cfg, board = self.config, self.board
        rs = board.sets[cfg.pool]
        among = decision.candidates(rs.endpoints, self.hint)
        pick, hashes = board.pick(cfg.pool, prompt=ask.prompt, among=among)
        endpoints = decision.decide(cfg, pick, rs.readings, decision.priority(cfg, self.headers, self.objectives), cfg.pool)
        self.sent = board.sent(cfg.pool, endpoints[0], hashes)
        EPP_DECISIONS.labels(cfg.pool, "picked").inc()
        return destination_reply(",".join(endpoints), content_length)

    def _finish(self) -> None:
        sent = self.sent
        if sent is None:
            return
        self.sent = None
        if self.served is None or self.served == sent.endpoint:
            self.board.done(sent, failed=self.failed)
            return
        # The proxy went down the list (the protocol's served-endpoint metadata): the pick failed,
        # and the one that answered is judged by its answer.
        self.board.done(sent, failed=True)
        if self.failed:
            self.board.mark_failed(sent.cluster, self.served)

    def close(self) -> None:
        """The stream ended (answered, reset or cancelled): the call no longer counts as in flight."""
        self._finish()


def destination_reply(value: str, content_length: int | None) -> pb.ProcessingResponse:
    """The request-headers reply of the protocol: the header and the `envoy.lb` metadata, same value."""
    headers = [(decision.DESTINATION_KEY, value)]
    if content_length is not None:  # the body comes back through us: say its length (the reference does)
        headers.append(("content-length", str(content_length)))
    r = msg.request_headers(headers, clear_route_cache=True)
    r.dynamic_metadata.fields[decision.DESTINATION_NAMESPACE].struct_value.fields[
        decision.DESTINATION_KEY].string_value = value
    return r

