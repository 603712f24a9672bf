"""OpenAI's legacy Completions (POST /v1/completions): the chat flow, with the caller's own API kept
upstream where the deployment serves it.

A model that lists the `completion` task type serves /v1/completions on its OpenAI-compatible
deployments (vLLM, SGLang, TGI): they get the caller's bytes, `echo`, `logprobs`, `n` and token
prompts included. Any other chat deployment gets the prompt as one user turn and answers in
`text_completion`'s shape; what a turn cannot carry is a 400 there (`ChatRequest.native_only`).
Routing, limits, metering, audit and the replica picker (prefix affinity on the prompt) are the
chat flow's.
"""

from __future__ import annotations

from adapters.internal import ChatRequest
from contracts.errors import ClientError
from extproc import messages as msg
from extproc.admission.choice import Choice
from extproc.cache.part import ResponseCache
from extproc.flows.chat import ChatFlow

# Deployment protocols whose servers answer /v1/completions beside chat (OpenAI-compatible ones).
NATIVE_PROTOCOLS = frozenset({"openai"})


def serves_completions(choice: Choice) -> bool:
    return "completion" in choice.model.task_types and choice.deployment.protocol in NATIVE_PROTOCOLS


class CompletionsFlow(ChatFlow):
    def _wire(self, choice: Choice) -> str:
        return "completions" if serves_completions(choice) else choice.deployment.protocol

    def _send(self, body: bytes, req: ChatRequest) -> msg.ProcessingResponse:
        choice = self.call.choice
        assert choice is not None  # routed first
        if req.native_only is not None and not serves_completions(choice):
            dep = choice.deployment
            raise ClientError(f"{req.native_only}: only a server answering /v1/completions itself can take this, and "
                              f"{choice.model.name} was routed to {dep.cluster}, a {dep.protocol} chat deployment (a "
                              "model whose servers answer it lists the `completion` task type)")
        return super()._send(body, req)

    async def _cached(self, cache: ResponseCache, req: ChatRequest, body: bytes) -> msg.ProcessingResponse | None:
        if req.native_only is not None:  # several choices, logprobs, echo: no stored answer replays them
            self.call.choice = await self.gw.dispatcher.choose_chat(self.ctx, req)
            return None
        return await super()._cached(cache, req, body)
