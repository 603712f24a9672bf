"""The route table, as a table: method + path -> the caller's protocol and what handles it."""

from __future__ import annotations

import functools

import pytest

from adapters.embeddings import EmbeddingRoute
from extproc.flows import batches, local
from extproc.flows.chat import ChatFlow
from extproc.flows.completions import CompletionsFlow
from extproc.flows.embeddings import EmbeddingFlow
from extproc.flows.kserve_grpc import GrpcInferFlow, answer_on_extproc
from extproc.flows.media import MediaFlow
from extproc.flows.vision import ClassifyFlow, KServeInferFlow
from extproc.flows.xlate import XlateFlow
from extproc.service import build_routes

ROUTES = build_routes()

CASES = [
    # method, path, protocol, handler, path_model, path_version, stream, public
    ("POST", "/v1/chat/completions", "openai", ChatFlow, None, None, False, False),
    ("POST", "/chat/completions", "openai", ChatFlow, None, None, False, False),
    ("POST", "/v1/messages", "anthropic", ChatFlow, None, None, False, False),
    ("POST", "/v1beta/models/gemini-x:generateContent", "gemini", ChatFlow, "gemini-x", None, False, False),
    ("POST", "/v1beta/models/gemini-x:streamGenerateContent", "gemini", ChatFlow, "gemini-x", None, True, False),
    ("POST", "/v1/models/a%2Fb:generateContent", "gemini", ChatFlow, "a/b", None, False, False),
    # OpenAI's path and Anthropic's: answered in the asker's shape (its anthropic-version header).
    ("GET", "/v1/models", "openai", local.list_models_any, None, None, False, False),
    ("GET", "/v1/models/demo-gpt", "openai", local.get_model_any, "demo-gpt", None, False, False),
    ("GET", "/v1beta/models", "gemini", local.gemini_list_models, None, None, False, False),
    ("GET", "/v1beta/models/demo-gpt", "gemini", local.gemini_get_model, "demo-gpt", None, False, False),
    # Files and batches: answered by the gateway (docs/batches.md).
    ("GET", "/v1/files", "openai", batches.answer, None, None, False, False),
    ("GET", "/v1/files/file-1/content", "openai", batches.answer, None, None, False, False),
    ("DELETE", "/v1/files/file-1", "openai", batches.answer, None, None, False, False),
    ("POST", "/v1/batches/batch_1/cancel", "openai", batches.answer, None, None, False, False),
    ("GET", "/v1/messages/batches/msgbatch_1/results", "anthropic", batches.answer, None, None, False, False),
    ("PUT", "/v1/batches", "openai", batches.answer, None, None, False, False),  # 405 in OpenAI's shape
    ("GET", "/v1/files/a/b/c", "openai", local.not_found, None, None, False, True),
    ("GET", "/v2/health/ready", "kserve", local.v2_ready, None, None, False, True),
    ("GET", "/v2/health/live", "kserve", local.v2_live, None, None, False, True),
    ("GET", "/v2", "kserve", local.v2_server_metadata, None, None, False, True),
    ("GET", "/v2/models/colors", "kserve", local.v2_model_metadata, "colors", None, False, False),
    ("GET", "/v2/models/colors/versions/2", "kserve", local.v2_model_metadata, "colors", "2", False, False),
    ("GET", "/v2/models/colors/ready", "kserve", local.v2_model_ready, "colors", None, False, False),
    ("GET", "/v2/models/colors/versions/2/ready", "kserve", local.v2_model_ready, "colors", "2", False, False),
    ("POST", "/v2/models/colors/infer", "kserve", KServeInferFlow, "colors", None, False, False),
    ("POST", "/v2/models/colors/versions/3/infer", "kserve", KServeInferFlow, "colors", "3", False, False),
    ("POST", "/v1/images/classify", "openai", ClassifyFlow, None, None, False, False),
    ("POST", "/v1/responses", "responses", ChatFlow, None, None, False, False),
    ("POST", "/v1/completions", "completions", CompletionsFlow, None, None, False, False),
    ("POST", "/completions", "completions", CompletionsFlow, None, None, False, False),
    ("GET", "/v1/responses/resp_1", "responses", local.stored_response, None, None, False, False),
    ("DELETE", "/v1/responses/resp_1", "responses", local.stored_response, None, None, False, False),
    ("GET", "/v1/responses/resp_1/input_items", "responses", local.stored_response, None, None, False, False),
    # KServe gRPC ingress: inference is a flow; the rest is answered on the extproc's own port.
    ("POST", "/inference.GRPCInferenceService/ModelInfer", "kserve-grpc", GrpcInferFlow, None, None, False, False),
    ("POST", "/inference.GRPCInferenceService/ModelMetadata", "kserve-grpc", answer_on_extproc, None, None, False,
     False),
    ("POST", "/inference.GRPCInferenceService/ModelReady", "kserve-grpc", answer_on_extproc, None, None, False, False),
    ("POST", "/inference.GRPCInferenceService/ServerReady", "kserve-grpc", answer_on_extproc, None, None, False, True),
    ("POST", "/inference.GRPCInferenceService/ServerLive", "kserve-grpc", answer_on_extproc, None, None, False, True),
    ("POST", "/inference.GRPCInferenceService/RepositoryIndex", "openai", local.not_found, None, None, False, True),
    # Everything else: the public 404 in OpenAI's shape.
    ("GET", "/v1/chat/completions", "openai", local.not_found, None, None, False, True),
    ("GET", "/v1/completions", "openai", local.not_found, None, None, False, True),
    ("POST", "/v1/models", "openai", local.not_found, None, None, False, True),
    ("GET", "/v2/models/colors/infer", "openai", local.not_found, None, None, False, True),
    # A Gemini model action the gateway does not serve: the public 404 in Gemini's shape.
    ("POST", "/v1beta/models/gemini-x:fooBar", "gemini", local.not_found, None, None, False, True),
    ("POST", "/v1/models/gemini-x:predict", "gemini", local.not_found, None, None, False, True),
    ("POST", "/v1beta/models/gemini-x:", "openai", local.not_found, None, None, False, True),
    ("DELETE", "/v1/messages", "openai", local.not_found, None, None, False, True),
    ("GET", "/nope", "openai", local.not_found, None, None, False, True),
]


@pytest.mark.parametrize("method,path,protocol,handler,model,version,stream,public", CASES,
                         ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_route_table(method, path, protocol, handler, model, version, stream, public) -> None:
    r = ROUTES.match(method, path)
    assert r.protocol == protocol
    assert (r.flow or r.answer) is handler
    assert (r.path_model, r.path_version, r.stream, r.public) == (model, version, stream, public)


@pytest.mark.parametrize(("method", "path", "protocol", "handler"), [
    ("POST", "/v1/files", "openai", batches.upload), ("POST", "/v1/batches", "openai", batches.create_batch),
    ("POST", "/v1/messages/batches", "anthropic", batches.create_message_batch),
    ("POST", "/v1/messages/count_tokens", "anthropic", local.count_tokens),
    ("POST", "/v1/responses/input_tokens", "responses", local.responses_input_tokens),  # not a stored response's id
    ("POST", "/v1beta/models/a%2Fb:countTokens", "gemini", local.gemini_count_tokens),
    ("POST", "/v1/models/a%2Fb:countTokens", "gemini", local.gemini_count_tokens),  # google-genai's default
])
def test_answers_made_from_the_body(method: str, path: str, protocol: str, handler: object) -> None:
    r = ROUTES.match(method, path)
    assert r.protocol == protocol and isinstance(r.flow, functools.partial) and r.flow.keywords["handler"] is handler
    assert r.path_model == ("a/b" if protocol == "gemini" else None)


@pytest.mark.parametrize("path", ["/v1/images/generations", "/v1/images/edits", "/v1/audio/transcriptions",
                                  "/v1/audio/translations", "/v1/audio/speech"])
def test_images_and_audio_are_media_flows(path: str) -> None:
    r = ROUTES.match("POST", path)
    assert r.protocol == "openai" and isinstance(r.flow, functools.partial) and r.flow.func is MediaFlow
    assert r.flow.keywords["endpoint"].path == path
    assert ROUTES.match("GET", path).answer is local.not_found


def test_only_chat_routes_may_be_carried_by_a_translation_hop() -> None:
    assert ROUTES.hop is XlateFlow
    translatable = {c[1] for c in CASES if ROUTES.match(c[0], c[1]).translatable}
    assert translatable == {c[1] for c in CASES if c[3] is ChatFlow}



@pytest.mark.parametrize(("path", "protocol", "shape", "model"), [
    ("/v1/embeddings", "openai", "openai", None),
    ("/v1beta/models/e:embedContent", "gemini", "gemini", "e"),
    ("/v1beta/models/e:batchEmbedContents", "gemini", "gemini-batch", "e"),
], ids=["openai", "gemini", "gemini-batch"])
def test_embedding_routes(path: str, protocol: str, shape: str, model: str | None) -> None:
    r = ROUTES.match("POST", path)
    assert isinstance(r.flow, functools.partial) and r.flow.func is EmbeddingFlow
    assert r.flow.keywords["route"] == EmbeddingRoute(shape, model)  # type: ignore[arg-type]
    assert (r.protocol, r.path_model, r.operation, r.public, r.translatable) == (protocol, model, "embeddings",
                                                                                   False, False)


def test_a_remembered_match_is_the_match() -> None:
    # Matches are remembered per (method, path): asking again, in any order, answers the same.
    table = build_routes()
    first = {(c[0], c[1]): table.match(c[0], c[1]) for c in CASES}
    for method, path, *_ in reversed(CASES):
        assert table.match(method, path) is first[(method, path)]
        assert table.match(method, path) == table._match(method, path)


def test_long_paths_are_matched_but_not_remembered() -> None:
    table = build_routes()
    path = "/v1beta/models/" + "g" * 400 + ":generateContent"
    assert table.match("POST", path).path_model == "g" * 400
    assert ("POST", path) not in table._seen
