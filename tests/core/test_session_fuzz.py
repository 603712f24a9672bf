"""Whatever bytes arrive on an LLM path, the session answers with a 4xx in the caller's shape or
sends the request on: never an unexpected exception (which would surface as a 502 from us)."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.session_driver import assert_refused_or_forwarded

PATHS = {
    "/v1/chat/completions": {"authorization": "Bearer sk-modelyard-demo"},
    "/v1/messages": {"x-api-key": "sk-modelyard-demo"},
    "/v1beta/models/demo-gpt:generateContent": {"x-goog-api-key": "sk-modelyard-demo"},
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "x"]),
                                           "content": json_values}), max_size=3)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(orjson.dumps),
    st.fixed_dictionaries({"model": st.sampled_from(["demo-gpt", "demo-claude", "auto", "nope"]),
                           "messages": messages, "max_tokens": json_values, "stream": json_values,
                           "tools": json_values}).map(orjson.dumps),
    st.fixed_dictionaries({"contents": st.lists(st.fixed_dictionaries({"role": json_values, "parts": json_values}),
                                                max_size=3)}).map(orjson.dumps),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(sorted(PATHS)), body=bodies)
def test_session_never_fails_on_input(gateway, caplog, path: str, body: bytes) -> None:
    assert_refused_or_forwarded(gateway, caplog, {":method": "POST", ":path": path, **PATHS[path]}, body)
