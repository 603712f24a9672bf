"""The audit log's hash chain, as pure code over row mappings (no SQLite, no clock).

Each row's `hash` is sha256 over the previous row's hash and the row's own fields, its id
included, so an edited, removed or reordered row breaks the chain at that row. A prune removes
a prefix and appends a `prune` row (chained like any other) that names the first kept id and
the hash the removed prefix ended with: the chain then starts there instead of at GENESIS.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import orjson

GENESIS = "0" * 64
PRUNE_EVENT = "prune"

# The columns a row's hash covers, in this order; `prev_hash` and `hash` are the chain itself.
CHAINED_FIELDS = ("id", "time", "event", "task_id", "tenant", "key_id", "client", "method", "path", "model",
                  "cluster", "status", "input_tokens", "output_tokens", "detail", "request_body",
                  "response_body")
COLUMNS = (*CHAINED_FIELDS, "prev_hash", "hash")


def row_hash(prev_hash: str, row: Mapping[str, object]) -> str:
    """sha256 over the previous hash and the row's chained fields (a JSON array: unambiguous)."""
    return hashlib.sha256(orjson.dumps([prev_hash, *(row[f] for f in CHAINED_FIELDS)])).hexdigest()


def key_id(api_key: str) -> str:
    """A short, stable name for a key: the first 12 hex digits of the sha256 the config holds
    (`sha256:<digest>`), so an operator can match it; the key itself is never stored."""
    return hashlib.sha256(api_key.encode("utf-8", "replace")).hexdigest()[:12]


def prune_detail(first_kept_id: int, anchor_hash: str, pruned_rows: int, older_than: float) -> dict[str, object]:
    return {"first_kept_id": first_kept_id, "anchor_hash": anchor_hash, "pruned_rows": pruned_rows,
            "older_than": older_than}


@dataclass(frozen=True)
class ChainBreak:
    row_id: int
    reason: str

    def __str__(self) -> str:
        return f"row {self.row_id}: {self.reason}"


@dataclass(frozen=True)
class ChainReport:
    rows: int
    head: str  # the last row's hash: record it elsewhere to catch a truncated tail later
    first_id: int | None
    broken: ChainBreak | None
    last_id: int | None = None

    @property
    def intact(self) -> bool:
        return self.broken is None


def prune_anchors(prune_rows: Iterable[Mapping[str, object]]) -> dict[int, str]:
    """first kept id -> the hash the pruned prefix ended with, from the prune rows' details."""
    out: dict[int, str] = {}
    for r in prune_rows:
        try:
            d = orjson.loads(str(r["detail"]))
            out[int(d["first_kept_id"])] = str(d["anchor_hash"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # a mangled prune row fails its own hash check in the walk
    return out


def verify_chain(rows: Iterable[Mapping[str, object]], anchors: Mapping[int, str]) -> ChainReport:
    """Walk rows in id order (streamed: the table may be large); the first row that does not
    hold is named, with why. `anchors` come from `prune_anchors` over the same table."""
    count = 0
    prev_hash, prev_id, first_id = GENESIS, None, None
    for r in rows:
        count += 1
        rid = int(str(r["id"]))
        if prev_id is None:
            first_id = rid
            if r["prev_hash"] != GENESIS and anchors.get(rid) != r["prev_hash"]:
                return ChainReport(count, "", first_id, ChainBreak(
                    rid, "the chain starts here without genesis or a prune anchor (earlier rows were removed)"))
        elif r["prev_hash"] != prev_hash:
            return ChainReport(count, "", first_id, ChainBreak(
                rid, f"prev_hash does not match row {prev_id} (a row was removed, inserted or reordered)"))
        if row_hash(str(r["prev_hash"]), r) != r["hash"]:
            return ChainReport(count, "", first_id, ChainBreak(
                rid, "content does not match its hash (the row was edited or moved)"))
        prev_hash, prev_id = str(r["hash"]), rid
    return ChainReport(count, prev_hash, first_id, None, prev_id)


def check_head(report: ChainReport, expected: str, hash_of: Callable[[int], str | None]) -> ChainBreak | None:
    """A head recorded earlier (`<id>:<hash>`, as `verify` prints it) against an intact chain:
    gone from the tail means rows were removed there; an id before the first row was pruned."""
    sid, _, want = expected.partition(":")
    if not sid.isdigit() or len(want) != 64:
        raise ValueError(f"expected <id>:<64 hex digits>, got {expected!r}")
    rid = int(sid)
    if report.last_id is None or rid > report.last_id:
        return ChainBreak(rid, "the recorded head is past the last row (rows at the tail were removed)")
    if report.first_id is not None and rid < report.first_id:
        return None  # pruned since: the prune anchor vouches for the prefix
    if hash_of(rid) != want:
        return ChainBreak(rid, "the recorded head's hash differs (the tail was removed and rewritten)")
    return None
