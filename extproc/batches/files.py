"""OpenAI's file object, pure: what an upload keeps and what `/v1/files` answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# OpenAI's purposes; a batch reads only `batch` files, the gateway writes `batch_output` ones.
PURPOSES = frozenset({"batch", "assistants", "fine-tune", "vision", "user_data", "evals"})
OUTPUT_PURPOSE = "batch_output"


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    tenant: str
    purpose: str
    filename: str
    bytes: int
    created_at: float


def file_view(rec: FileRecord) -> dict[str, Any]:
    return {"id": rec.id, "object": "file", "bytes": rec.bytes, "created_at": int(rec.created_at),
            "expires_at": None, "filename": rec.filename, "purpose": rec.purpose, "status": "processed",
            "status_details": None}


def list_view(recs: list[FileRecord], has_more: bool) -> dict[str, Any]:
    data = [file_view(r) for r in recs]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def deleted_view(file_id: str) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "deleted": True}
