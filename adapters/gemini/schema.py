"""JSON Schema <-> Gemini's OpenAPI-subset Schema (tool parameters, response schemas)."""

from __future__ import annotations

from adapters.json_types import JSONObject
from contracts.errors import ClientError

# Keys of Gemini's OpenAPI-subset Schema; anything else in a JSON Schema is dropped on the way up.
_SCHEMA_KEYS = frozenset((
    "type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems", "properties",
    "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern", "example", "anyOf",
    "propertyOrdering", "default", "items", "minimum", "maximum",
))


def json_schema(schema: JSONObject) -> JSONObject:
    """Gemini's OpenAPI-subset Schema as JSON Schema for other targets: types lower-case
    (`STRING` -> `string`), `nullable` as a `null` type, Gemini-only keys dropped."""
    out: JSONObject = {}
    for k, v in schema.items():
        if k == "type" and type(v) is str:
            out[k] = v.lower()
        elif k in ("properties",) and type(v) is dict:
            out[k] = {pk: json_schema(pv) if type(pv) is dict else pv for pk, pv in v.items()}
        elif k == "items" and type(v) is dict:
            out[k] = json_schema(v)
        elif k == "anyOf" and type(v) is list:
            out[k] = [json_schema(x) if type(x) is dict else x for x in v]
        elif k not in ("nullable", "propertyOrdering"):
            out[k] = v
    if schema.get("nullable") is True:
        t = out.get("type")
        out["type"] = [t, "null"] if type(t) is str else ["null"]
    return out


def gemini_schema(schema: JSONObject) -> JSONObject:
    """A JSON Schema as Gemini's OpenAPI-subset Schema: `$ref`s into `$defs`/`definitions` are
    inlined, `type: [T, "null"]` and `anyOf [.., {type: null}]` become `nullable`, `const` an enum.
    A recursive schema cannot be inlined and is refused (400)."""
    defs: JSONObject = {}
    for key in ("definitions", "$defs"):
        d = schema.get(key)
        if type(d) is dict:
            defs.update(d)
    out = _schema(schema, defs, ())
    assert type(out) is dict
    return out


def _resolve(ref: str, defs: JSONObject, stack: tuple[str, ...]) -> tuple[str, JSONObject]:
    for prefix in ("#/$defs/", "#/definitions/"):
        if ref.startswith(prefix):
            name = ref[len(prefix):]
            target = defs.get(name)
            if type(target) is dict:
                if name in stack:
                    raise ClientError(f"tool schema: recursive $ref {ref!r} cannot be expressed for Gemini")
                return name, target
    raise ClientError(f"tool schema: $ref {ref!r} does not resolve to a local definition")


def _schema(s: object, defs: JSONObject, stack: tuple[str, ...]) -> object:
    if type(s) is not dict:
        return s
    ref = s.get("$ref")
    if type(ref) is str:
        name, target = _resolve(ref, defs, stack)
        return _schema({**target, **{k: v for k, v in s.items() if k != "$ref"}}, defs, (*stack, name))
    out: dict[str, object] = {}
    for k, v in s.items():
        if k == "type" and type(v) is list:
            types = [t for t in v if t != "null"]
            if len(types) < len(v):
                out["nullable"] = True
            if len(types) == 1:
                out["type"] = types[0]
            elif types:
                out["anyOf"] = [{"type": t} for t in types]
        elif k == "type" and v == "null":
            out["nullable"] = True
        elif k in ("anyOf", "oneOf") and type(v) is list:
            alts = [x for x in v if not (type(x) is dict and x.get("type") == "null")]
            if len(alts) < len(v):
                out["nullable"] = True
            conv = [_schema(x, defs, stack) for x in alts]
            if len(conv) == 1 and type(conv[0]) is dict:
                out.update({ck: cv for ck, cv in conv[0].items() if ck not in out})
            elif conv:
                out["anyOf"] = conv
        elif k == "const":
            out["enum"] = [v]
        elif k not in _SCHEMA_KEYS:
            continue
        elif k == "properties" and type(v) is dict:
            out[k] = {pk: _schema(pv, defs, stack) for pk, pv in v.items()}
        elif k == "items":
            out[k] = _schema(v, defs, stack)
        else:
            out[k] = v
    return out
