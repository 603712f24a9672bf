"""Which call kind grows the extproc's resident memory: rounds of N calls of one kind on the shipped
config (free ports), the extproc's RSS after each; the soak's growth split by kind (docs/reliability.md).

    .venv/bin/python bench/rss_probe.py chat|stream|task|anthropic N [ROUNDS]
"""
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tests.stack_config import demo_config_free_ports, start_stack  # noqa: E402

KIND = sys.argv[1]; N = int(sys.argv[2])
def rss(pid):
    for l in Path(f"/proc/{pid}/status").read_text().splitlines():
        if l.startswith("VmRSS"): return int(l.split()[1]) / 1024
H = {"authorization": "Bearer sk-modelyard-demo"}
with tempfile.TemporaryDirectory() as tmp:
    data, _ = demo_config_free_ports()
    with start_stack(Path(tmp), data, shared_demos=True) as st, httpx.Client(base_url=st.url, headers=H, timeout=30) as c:
        pid = st.child("extproc").proc.pid
        out = []
        for r in range(int(sys.argv[3]) if len(sys.argv) > 3 else 7):
            for i in range(N):
                if KIND == "chat":
                    x = c.post("/v1/chat/completions", json={"model": "demo-gpt", "messages": [{"role": "user", "content": f"hi {i}"}]})
                elif KIND == "stream":
                    x = c.post("/v1/chat/completions", json={"model": "demo-gpt", "stream": True, "messages": [{"role": "user", "content": f"hi {i}"}]})
                elif KIND == "task":
                    x = c.post("/v1/chat/completions", headers={"prefer": "respond-async"}, json={"model": "demo-gpt", "messages": [{"role": "user", "content": f"hi {i}"}]})
                elif KIND == "anthropic":
                    x = c.post("/v1/messages", headers={"x-api-key": "sk-modelyard-demo", "anthropic-version": "2023-06-01"}, json={"model": "demo-claude", "max_tokens": 20, "messages": [{"role": "user", "content": f"hi {i}"}]})
                assert x.status_code in (200, 202), x.text
            time.sleep(1)
            out.append(round(rss(pid), 1))
            print(KIND, r, out[-1], flush=True)
        print(KIND, "growth per 1000 calls after warm-up (MiB):", round((out[-1] - out[1]) / ((len(out) - 2) * N) * 1000, 2))
