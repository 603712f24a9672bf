"""The internal embedding request and response, the shapes they travel in, and the embeddings routes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import unquote

from adapters.fields import bad_upstream
from adapters.json_types import JSONArray, JSONObject

if TYPE_CHECKING:  # NumPy loads on first use: a demo upstream that never embeds never pays its import
    import numpy as np

OPENAI_PATH = "/v1/embeddings"
MAX_INPUTS = 2048  # OpenAI's own limit per request; Gemini batches take 100, checked by Gemini itself
MAX_EMBED_JSON_VALUES = 50_000
# The deployment protocols that serve embeddings (config load refuses others on an embedding model).
EMBEDDING_PROTOCOLS = frozenset({"openai", "gemini"})
_GEMINI_PREFIXES = ("/v1beta/models/", "/v1/models/")

# Which wire shape a request or answer is in: OpenAI, Gemini embedContent, Gemini batchEmbedContents.
Shape = Literal["openai", "gemini", "gemini-batch"]
EncodingFormat = Literal["float", "base64"]


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str, ...]
    encoding_format: EncodingFormat = "float"  # what the client wants back (OpenAI only)
    dimensions: int | None = None  # OpenAI `dimensions` = Gemini `outputDimensionality`
    task_type: str | None = None  # Gemini `taskType` (RETRIEVAL_QUERY, ...); OpenAI has no such field
    title: str | None = None  # Gemini `title` (RETRIEVAL_DOCUMENT only)
    single: bool = False  # OpenAI `input` was one string, not a list (the upstream gets it back alike)


@dataclass(frozen=True, slots=True, eq=False)
class EmbeddingResponse:
    model: str
    vectors: np.ndarray  # float32, shape (inputs, dimensions)
    input_tokens: int | None = None  # None: the upstream does not report usage (Gemini)
    extra: JSONObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EmbeddingRoute:
    shape: Shape
    model: str | None = None  # from the path (Gemini)


def match_path(method: str, path: str) -> EmbeddingRoute | None:
    """An embeddings endpoint from method and path (query string ignored), else None."""
    if method.upper() != "POST":
        return None
    p = path.split("?", 1)[0]
    if p == OPENAI_PATH or p == "/embeddings":
        return EmbeddingRoute("openai")
    for prefix in _GEMINI_PREFIXES:
        if p.startswith(prefix):
            model, sep, action = p[len(prefix):].rpartition(":")
            if sep and model and action == "embedContent":
                return EmbeddingRoute("gemini", unquote(model))
            if sep and model and action == "batchEmbedContents":
                return EmbeddingRoute("gemini-batch", unquote(model))
    return None


def estimate_tokens(req: EmbeddingRequest) -> int:
    """A rate-limit and metering estimate when the upstream reports none: chars / 4, 1 per input at least."""
    return sum(max(1, len(s) // 4) for s in req.inputs)


def longest_input_tokens(req: EmbeddingRequest) -> int:
    """The longest input's estimate: what a model's context window must hold (inputs embed one by one)."""
    return max(max(1, len(s) // 4) for s in req.inputs)


def _matrix(rows: JSONArray, where: str) -> np.ndarray:
    import numpy as np

    if not rows:
        return np.zeros((0, 0), np.float32)
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise bad_upstream(f"{where}: vectors of different lengths")
    try:
        return np.array(rows, dtype=np.float32).reshape(len(rows), width)
    except (TypeError, ValueError):
        raise bad_upstream(f"{where}: a vector holds something other than numbers") from None
