"""Structured outputs: is an answer JSON, valid against a JSON Schema? (pure; jsonschema's validators)"""

from __future__ import annotations

import orjson

from adapters.json_types import JSONObject


def conforms(schema: JSONObject, text: str) -> bool:
    """True when `text` is one JSON document valid against `schema` (an invalid schema: False)."""
    import jsonschema  # loaded by the first structured check, not by every process

    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        return bool(validator.is_valid(doc))
    except (jsonschema.SchemaError, jsonschema.exceptions.UnknownType, jsonschema.exceptions.RefResolutionError):
        return False
