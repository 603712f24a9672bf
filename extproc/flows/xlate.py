"""A failover retry arriving at a translation hop (an Envoy internal listener).

The body is in the failed primary's protocol: render it for the hop's target deployment and
translate the answer back into that protocol.
"""

from __future__ import annotations

from extproc import messages as msg
from extproc.admission.choice import Choice
from extproc.context import RequestContext
from extproc.flows.chat import ChatFlow
from extproc.gateway import Gateway


class XlateFlow(ChatFlow):
    """A failover retry arriving at a translation hop (an Envoy internal listener): the body is in
    the failed primary's protocol. Render it for the hop's target deployment and translate the
    answer back into that protocol. No routing, limits or metering here: the outer request,
    which sees this answer as its own, already did those."""

    metered = False

    def __init__(self, gw: Gateway, ctx: RequestContext, target: str):
        super().__init__(gw, ctx)
        self.target = target

    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        req = await self._parse(body)
        model, dep = self.gw.catalog.deployment(self.target)
        self.call.choice = Choice(model=model, deployment=dep, channel=dep.channel)
        await self.call.authorize()  # the hop's target deployment's own credential
        return self._send(body, req)
