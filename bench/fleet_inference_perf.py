"""Drive one bench_replicas run with `inference-perf` (the Gateway API Inference Extension's
benchmark tool, PyPI; Python >= 3.12, so its own venv: --inference-perf-venv).

Its `shared_prefix` data (8 groups of prompts on one system prompt each; with
`enable_multi_turn_chat` every prompt is a session whose rounds resend its history, about 4 rounds
each), uneven question and answer lengths, Poisson arrivals. That data goes out as text completions (`/v1/completions`, even with `api.type: chat`):
through the gateway (the fleet's models list the `completion` task type, so the bytes pass through
to the replica the picker or Envoy's balancer chose) and to the Rust routers alike. It needs a
tokenizer to size prompts: Hugging Face is out of reach here, so a word-level one is built on the
spot from the workload's words (`tokenizer_dir`, run by the venv's own Python).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml

from bench.fleet_load import WORDS

_MAKE_TOKENIZER = """
import string, sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, "[BOS]": 1, "[EOS]": 2}
for w in sys.argv[2].split() + list(string.ascii_letters + string.digits + string.punctuation):
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]",
                        eos_token="[EOS]").save_pretrained(sys.argv[1])
"""


def tokenizer_dir(venv: Path, out: Path) -> Path:
    subprocess.run([str(venv / "bin" / "python"), "-c", _MAKE_TOKENIZER, str(out), " ".join(WORDS)], check=True,
                   capture_output=True)
    return out


def run(venv: Path, tokenizer: Path, work: Path, base_url: str, model: str, api_key: str | None, rate: float,
        duration: float, seed: int) -> dict[str, Any]:
    """One inference-perf run; its figures in bench_replicas' keys (TTFT in ms)."""
    out = work / f"ip-{model}-{rate:g}-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    cfg = {
        "load": {"type": "poisson", "stages": [{"rate": rate, "duration": max(1, int(duration))}]},
        "api": {"type": "chat", "streaming": True},
        "server": {"type": "vllm", "model_name": model, "base_url": base_url, "ignore_eos": True,
                   **({"api_key": api_key} if api_key else {})},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        # Each prompt is a session whose every round resends its history: with a fixed 32 sessions a
        # 24/s run gave each 15 rounds, past any replica's KV cache (the fleet's 400, as vLLM's past
        # max_model_len); prompts per group grow with the run instead, about 4 rounds a session.
        "data": {"type": "shared_prefix", "shared_prefix": {
            "num_groups": 8, "num_prompts_per_group": max(4, math.ceil(rate * duration / 32)),
            "system_prompt_len": 1600, "seed": seed,
            "question_len": {"min": 20, "max": 1500, "mean": 200, "std_dev": 300},
            "output_len": {"min": 16, "max": 256, "mean": 100, "std_dev": 70},
            "enable_multi_turn_chat": True}},
        "report": {"request_lifecycle": {"summary": True}},
        "storage": {"local_storage": {"path": str(out)}},
    }
    (out / "config.yml").write_text(yaml.safe_dump(cfg))
    # Its own process group: its load-generating worker processes go with it when a run is cut short.
    with subprocess.Popen([str(venv / "bin" / "inference-perf"), "--config_file", str(out / "config.yml")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}) as popen:
        try:
            stdout, stderr = popen.communicate(timeout=max(600, 10 * duration))
        except BaseException:
            os.killpg(popen.pid, signal.SIGKILL)
            raise
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)
    summary = out / "summary_lifecycle_metrics.json"
    if proc.returncode != 0 or not summary.exists():
        raise RuntimeError(f"inference-perf exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    d = json.loads(summary.read_text())
    ok, bad = d["successes"], d["failures"]
    ttft = ok["latency"]["time_to_first_token"]
    if not ttft:
        raise RuntimeError(f"inference-perf: no TTFT ({ok['count']} ok, {bad['count']} failed): {str(bad)[:800]}")
    return {"requests": ok["count"] + bad["count"], "ok": ok["count"], "errors": bad["count"],
            "ttft_p50_ms": ttft["median"] * 1000, "ttft_p99_ms": ttft["p99"] * 1000,
            "ttft_mean_ms": ttft["mean"] * 1000, "output_tok_s": ok["throughput"]["output_tokens_per_sec"],
            "wall_s": d["benchmark_time_seconds"], "first_errors": [] if not bad["count"] else [str(bad)[:160]]}
