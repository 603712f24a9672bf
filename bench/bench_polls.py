"""Async task polls with the SDKs' default headers, on a stack compressing as the shipped environments do:
the bytes a poll puts on the wire (gzip for httpx's default Accept-Encoding, identity when asked) and
the stored result's size against the synchronous answer's (equal: the identity answer is stored).

Sizes, not times: one task per prompt size. Any unexpected answer fails with a `FAILED:` line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import httpx
import openai
from openai.types.chat import ChatCompletionUserMessageParam

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.smoke import scaled  # noqa: E402
from controlplane.environments import CompressionSettings, EnvironmentConfig  # noqa: E402
from tests.stack_config import small_config, start_stack  # noqa: E402

KEY = "sk-modelyard-demo"
AUTH = {"authorization": f"Bearer {KEY}"}


def _wire_bytes(c: httpx.Client, url: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    with c.stream("GET", url, headers=headers) as r:
        raw = b"".join(r.iter_raw())
        return len(raw), r.headers.get("content-encoding", "identity"), raw


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=scaled([64, 4096, 32768], [4096]),
                   help="prompt characters")
    a = p.parse_args(argv)
    failures: list[str] = []
    rows = []
    env = EnvironmentConfig(name="bench", admin=None, concurrency=1,
                            compression=CompressionSettings(response_encodings=["gzip"]))
    with tempfile.TemporaryDirectory(prefix="bench-task-polls-") as tmp:
        data = small_config()
        data["extproc"]["tasks"] = {"sqlite_path": str(Path(tmp) / "tasks.sqlite")}
        with start_stack(Path(tmp), data, env) as stack, httpx.Client(timeout=60) as c:
            oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
            print(f"{'prompt':>8} {'sync':>8} {'stored':>8} {'poll gzip':>10} {'poll identity':>14}")
            for size in a.sizes:
                messages: list[ChatCompletionUserMessageParam] = [
                    {"role": "user", "content": ("readable " * (size // 9 + 1))[:size]}]
                sync = oai.chat.completions.with_raw_response.create(model="demo-gpt", messages=messages)
                raw = oai.chat.completions.with_raw_response.create(
                    model="demo-gpt", messages=messages, extra_headers={"prefer": "respond-async"})
                task_url = f"{stack.url}{raw.headers['location']}"
                doc = c.get(task_url + "?wait=30", headers=AUTH).json()
                if doc["status"] != "succeeded" or doc["result"] is None:
                    failures.append(f"{size}: {doc['status']}, result {doc['result']!r:.60}")
                    continue
                _, _, stored = _wire_bytes(c, task_url + "/result", {**AUTH, "accept-encoding": "identity"})
                gz, coding, _ = _wire_bytes(c, task_url, AUTH)  # httpx's default Accept-Encoding
                ident, _, _ = _wire_bytes(c, task_url, {**AUTH, "accept-encoding": "identity"})
                if coding != "gzip":
                    failures.append(f"{size}: the poll came back {coding}, not gzip")
                if json.loads(stored)["choices"] != json.loads(sync.http_response.content)["choices"]:
                    failures.append(f"{size}: the stored result is not the synchronous answer")
                print(f"{size:>8} {len(sync.http_response.content):>8} {len(stored):>8} {gz:>10} {ident:>14}")
                rows.append({"bench": "polls", "case": f"task poll, {size}-char prompt", "metric": "gzip bytes",
                             "value": gz, "unit": "B", "ratio": gz / ident})
    print("SUMMARY " + json.dumps(rows))
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
