"""The ext_proc processing modes the rendered configs share."""

from __future__ import annotations

from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)


def duplex_mode() -> ProcessingMode:
    """Headers sent, bodies FULL_DUPLEX_STREAMED both ways: each body comes right behind its headers and the
    processor answers when it chooses. Envoy requires trailers sent with a duplex body (they may end it)."""
    return ProcessingMode(
        request_header_mode=ProcessingModeHeaderSendMode.SEND,
        response_header_mode=ProcessingModeHeaderSendMode.SEND,
        request_body_mode=ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED,
        response_body_mode=ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED,
        request_trailer_mode=ProcessingModeHeaderSendMode.SEND,
        response_trailer_mode=ProcessingModeHeaderSendMode.SEND,
    )
