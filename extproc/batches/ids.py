"""The ids of files, batches and their lines; a line's task id says which batch it belongs to.

A line's task id reaches the session only inside the replay marker, which only the extproc can
sign, so "this call is a batch line" (billed at the batch price) cannot be claimed by a client.
"""

from __future__ import annotations

import os

OPENAI_PREFIX = "batch_"
ANTHROPIC_PREFIX = "msgbatch_"
FILE_PREFIX = "file-"


def new_batch_id(api: str) -> str:
    return (ANTHROPIC_PREFIX if api == "anthropic" else OPENAI_PREFIX) + os.urandom(12).hex()


def new_file_id() -> str:
    return FILE_PREFIX + os.urandom(12).hex()


def line_task_id(batch_id: str, index: int) -> str:
    return f"{batch_id}-{index}"


def is_batch_line(task_id: str) -> bool:
    return task_id.startswith((OPENAI_PREFIX, ANTHROPIC_PREFIX))


def result_file_id(batch_id: str, kind: str) -> str:
    """The output (`output`), error (`error`) or Anthropic results (`results`) file of a batch: fixed
    ids, so two finalizers (workers, replicas) write the very same files."""
    return f"{FILE_PREFIX}{batch_id}-{kind}"
