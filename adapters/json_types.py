"""Static names for parsed JSON of a shape not yet checked: parsers read it field by field.

Aliases only (no runtime cost): a request body is validated where it is read, so its static type
says "some JSON object" and each reader narrows what it takes (`type(v) is str`, `as_object`).
Rendered bodies, whose shape we choose, are TypedDicts in each protocol's `wire` module.
"""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = ["JSONObject", "JSONArray"]

JSONObject: TypeAlias = dict[str, Any]
JSONArray: TypeAlias = list[Any]
