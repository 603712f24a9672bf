"""Compressed bodies at the edge, in Envoy: request bodies are inflated before the extproc reads them
(Envoy's decompressor filter, one per encoding), and answers are compressed for clients that ask
(its compressor filter, streams chunk by chunk), as each environment's `compression:` says.

Envoy ships no `deflate` decompressor (its zlib one reads gzip framing only); a request in an
encoding no filter took is refused by the extproc with 415 in the caller's shape (`extproc.session`).
"""

from __future__ import annotations

# Register the typed_config types, so Any fields resolve when the bootstrap is written out.
from envoy.extensions.compression.brotli.compressor.v3 import brotli_pb2  # noqa: F401
from envoy.extensions.compression.brotli.decompressor.v3 import brotli_pb2 as _brotli_d  # noqa: F401
from envoy.extensions.compression.gzip.compressor.v3 import gzip_pb2  # noqa: F401
from envoy.extensions.compression.gzip.decompressor.v3 import gzip_pb2 as _gzip_d  # noqa: F401
from envoy.extensions.compression.zstd.compressor.v3 import zstd_pb2  # noqa: F401
from envoy.extensions.compression.zstd.decompressor.v3 import zstd_pb2 as _zstd_d  # noqa: F401
from envoy.extensions.filters.http.compressor.v3 import compressor_pb2  # noqa: F401
from envoy.extensions.filters.http.decompressor.v3 import decompressor_pb2  # noqa: F401
from envoy_data_plane.envoy.config.core.v3 import RuntimeFeatureFlag, TypedExtensionConfig
from envoy_data_plane.envoy.extensions.compression.brotli.compressor.v3 import Brotli as BrotliCompressor
from envoy_data_plane.envoy.extensions.compression.brotli.decompressor.v3 import Brotli as BrotliDecompressor
from envoy_data_plane.envoy.extensions.compression.gzip.compressor.v3 import Gzip as GzipCompressor
from envoy_data_plane.envoy.extensions.compression.gzip.decompressor.v3 import Gzip as GzipDecompressor
from envoy_data_plane.envoy.extensions.compression.zstd.compressor.v3 import Zstd as ZstdCompressor
from envoy_data_plane.envoy.extensions.compression.zstd.decompressor.v3 import Zstd as ZstdDecompressor
from envoy_data_plane.envoy.extensions.filters.http.compressor.v3 import (
    Compressor,
    CompressorCommonDirectionConfig,
    CompressorResponseDirectionConfig,
)
from envoy_data_plane.envoy.extensions.filters.http.decompressor.v3 import (
    Decompressor,
    DecompressorCommonDirectionConfig,
    DecompressorRequestDirectionConfig,
    DecompressorResponseDirectionConfig,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import HttpFilter
from envoy_data_plane.google.protobuf import Any as AnyMsg

from controlplane.environments import CompressionSettings

_DECOMPRESSORS = {"gzip": GzipDecompressor, "br": BrotliDecompressor, "zstd": ZstdDecompressor}
_COMPRESSORS = {"gzip": GzipCompressor, "br": BrotliCompressor, "zstd": ZstdCompressor}
_LIBRARY = {"gzip": "gzip", "br": "brotli", "zstd": "zstd"}
# What the gateway answers with: JSON bodies and SSE streams (Envoy's default list has no SSE).
RESPONSE_TYPES = ["application/json", "text/event-stream", "application/x-ndjson", "text/plain"]


def decompressor_filters(c: CompressionSettings) -> list[HttpFilter]:
    """Inflate request bodies before the extproc; never touch answers (upstreams are asked for none)."""
    off = DecompressorCommonDirectionConfig(
        enabled=RuntimeFeatureFlag(default_value=False, runtime_key="modelyard.decompress_responses"))
    return [HttpFilter(name=f"envoy.filters.http.decompressor.{enc}", typed_config=AnyMsg.pack(Decompressor(
        decompressor_library=TypedExtensionConfig(name=_LIBRARY[enc], typed_config=AnyMsg.pack(_DECOMPRESSORS[enc]())),
        request_direction_config=DecompressorRequestDirectionConfig(advertise_accept_encoding=False),
        response_direction_config=DecompressorResponseDirectionConfig(common_config=off))))
        for enc in c.request_encodings]


def compressor_filters(c: CompressionSettings) -> list[HttpFilter]:
    """Compress answers for clients whose Accept-Encoding allows it; first listed, first preferred."""
    common = CompressorCommonDirectionConfig(min_content_length=c.min_response_bytes, content_type=RESPONSE_TYPES)
    return [HttpFilter(name=f"envoy.filters.http.compressor.{enc}", typed_config=AnyMsg.pack(Compressor(
        compressor_library=TypedExtensionConfig(name=_LIBRARY[enc], typed_config=AnyMsg.pack(_COMPRESSORS[enc]())),
        response_direction_config=CompressorResponseDirectionConfig(common_config=common),
        choose_first=i == 0)))
        for i, enc in enumerate(c.response_encodings)]
