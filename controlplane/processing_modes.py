"""The ext_proc processing modes the rendered configs share: the filter's own, and the full-duplex one
the chat routes and the inference pool's picker override it with."""

from __future__ import annotations

from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)


def _mode(body: ProcessingModeBodySendMode, request_trailers: ProcessingModeHeaderSendMode) -> ProcessingMode:
    # Headers both ways and the answer's trailers always go to the processor (a gRPC answer's status
    # comes in them); only the bodies' mode and the request's trailers differ between the designs.
    return ProcessingMode(
        request_header_mode=ProcessingModeHeaderSendMode.SEND,
        response_header_mode=ProcessingModeHeaderSendMode.SEND,
        request_body_mode=body,
        response_body_mode=body,
        request_trailer_mode=request_trailers,
        response_trailer_mode=ProcessingModeHeaderSendMode.SEND,
    )


def buffered_mode() -> ProcessingMode:
    """Bodies BUFFERED both ways, each step answered before the next: the filter's mode for every path a
    route does not override. A buffered body step sees its body whole, so the request's trailers are skipped."""
    return _mode(ProcessingModeBodySendMode.BUFFERED, ProcessingModeHeaderSendMode.SKIP)


def duplex_mode() -> ProcessingMode:
    """Headers sent, bodies FULL_DUPLEX_STREAMED both ways: each body comes right behind its headers and the
    processor answers when it chooses. Envoy requires trailers sent with a duplex body (they may end it)."""
    return _mode(ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED, ProcessingModeHeaderSendMode.SEND)
