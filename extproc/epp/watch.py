"""The Kubernetes API's list+watch protocol, sans-I/O: a `Collection` takes a list response, then
the bytes of a watch stream as they arrive, and keeps the objects and the resourceVersion to
resume from. The shell (kubeapi.py) does the HTTP.

- a list (`GET .../pods`) gives every object and the collection's `metadata.resourceVersion`;
- a watch (`?watch=1&resourceVersion=RV&allowWatchBookmarks=true`) is newline-delimited JSON
  events `{"type": ..., "object": ...}`: ADDED and MODIFIED put the object, DELETED drops it,
  BOOKMARK only moves the resourceVersion on, ERROR carries a `Status`;
- a Status with code 410 (`Expired` / `Gone`: the version fell out of the server's history,
  in the stream or as the watch's own HTTP status) means: list again (`Expired` is raised);
- a watch the server ends (its timeout, a restart) resumes from the last resourceVersion seen,
  so nothing between the two watches is lost.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Object = dict[str, Any]


class Expired(Exception):
    """The resourceVersion is too old (410): list again."""


class WatchFailed(Exception):
    """An ERROR event other than 410, or a line that is no watch event."""


def key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def status_error(status: Mapping[str, Any]) -> Exception:
    """The exception for a `Status` object (an ERROR event's, or an HTTP error's body)."""
    if status.get("code") == 410 or status.get("reason") in ("Expired", "Gone"):
        return Expired(str(status.get("message") or "resource version too old"))
    return WatchFailed(f"{status.get('code')} {status.get('reason')}: {status.get('message')}")


@dataclass
class Collection:
    """One watched kind's objects (namespace/name -> object) and where to resume."""

    items: dict[str, Object] = field(default_factory=dict)
    resource_version: str | None = None  # None: list (again) before watching
    _partial: bytearray = field(default_factory=bytearray)

    def replace(self, body: bytes | Mapping[str, Any]) -> None:
        """A list response: the whole collection as of its resourceVersion."""
        doc = json.loads(body) if isinstance(body, bytes | bytearray) else body
        if not isinstance(doc, Mapping) or not isinstance(doc.get("items"), list | type(None)):
            raise WatchFailed("a list response without items")
        if doc.get("kind") == "Status":
            raise status_error(doc)
        rv = (doc.get("metadata") or {}).get("resourceVersion")
        if not rv:
            raise WatchFailed("a list response without metadata.resourceVersion")
        self.items = {key(o): o for o in doc.get("items") or [] if isinstance(o, dict)}
        self.resource_version = str(rv)
        self._partial.clear()

    def start_watch(self) -> None:
        """A new watch connection: a line cut off by the last one is dropped (its event comes again)."""
        self._partial.clear()

    def expire(self) -> None:
        self.resource_version = None
        self._partial.clear()

    def feed(self, chunk: bytes) -> int:
        """Bytes of the watch stream, cut anywhere; the number of objects that changed."""
        self._partial += chunk
        changed = 0
        while (nl := self._partial.find(b"\n")) >= 0:
            line = bytes(self._partial[:nl]).strip()
            del self._partial[:nl + 1]
            if line:
                changed += self.apply(line)
        return changed

    def apply(self, line: bytes | Mapping[str, Any]) -> bool:
        """One watch event; True when an object was put or dropped."""
        if isinstance(line, bytes | bytearray):
            try:
                event = json.loads(line)
            except ValueError:
                raise WatchFailed(f"not a watch event: {bytes(line)[:200]!r}") from None
        else:
            event = line
        if not isinstance(event, Mapping) or not isinstance(event.get("object"), Mapping):
            raise WatchFailed(f"not a watch event: {str(event)[:200]}")
        kind, obj = event.get("type"), event["object"]
        if kind == "ERROR":
            raise status_error(obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            return False
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise WatchFailed(f"unknown watch event type {kind!r}")
        if rv:
            self.resource_version = str(rv)
        if kind == "DELETED":
            return self.items.pop(key(obj), None) is not None
        self.items[key(obj)] = dict(obj)
        return True
