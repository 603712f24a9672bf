"""Which nearest-neighbour index the semantic response cache uses, by measurement.

    .venv/bin/python bench/bench_semantic.py [--sizes 10000,100000] [--dims 256,768] [--queries N] [--rounds R]

For each size (stored prompts in one partition) and dimension (256: the shipped demo embedder as
`demo-gpt-semantic` asks it; 768: a common sentence-embedding width), the same unit vectors go into:
`numpy` (extproc/cache/vector_index.py: one float32 matrix, one matrix-vector product, what the
cache ships), and where they are installed (`pip install -e .[bench-ann]`) `hnswlib` (HNSW, M=16,
ef_construction=200, ef=64), `usearch` (HNSW, its defaults), `faiss-flat` (IndexFlatIP, exact) and
`faiss-hnsw` (IndexHNSWFlat, M=32, efSearch=64). Queries are stored rows plus noise (a paraphrase:
the nearest row is the one it came from, the second is not far behind only by chance).

Per index: build time (every row added, as a start rebuilds the index), lookup p50/p99 of one query
at a time (a request does one), recall@1 against the exact answer (NumPy's). Lookups run on one
thread (the loop's lookup runs beside other requests: per-query cost is what counts); builds use
every core. The ANN libraries are built only up to `--ann-max-rows` (10,000 by default: an HNSW
build of 100,000 rows takes minutes here, past make bench's bound); pass a larger one by hand.
`redis-fetch` is the other Redis design the cache did not take: fetching the partition's matrix
from Redis for each lookup (one GET of rows x dim float32), timed where a redis-server is found.
The last stdout line is `SUMMARY [...]`.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before NumPy loads
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import orjson  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.smoke import scaled  # noqa: E402
from extproc.cache.vector_index import VectorIndex  # noqa: E402

Search = Callable[[np.ndarray], int]  # one query -> the row it finds
BUILD_THREADS = os.cpu_count() or 1  # a build (a start's rebuild) may use every core; a lookup uses one


def _data(n: int, dim: int, queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n, dim), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    picks = rng.integers(0, n, queries)
    q = rows[picks] + rng.standard_normal((queries, dim), dtype=np.float32) * (0.6 / np.sqrt(dim))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return rows, q


def _numpy(rows: np.ndarray) -> Search:
    index = VectorIndex()
    for i, r in enumerate(rows):
        index.add("p", str(i), r, 1e12)

    def search(q: np.ndarray) -> int:
        m = index.search("p", q, 0.0)
        return -1 if m is None else int(m.key)
    return search


def _hnswlib(rows: np.ndarray) -> Search:
    hnswlib = importlib.import_module("hnswlib")  # bench-ann's libraries ship no types: imported by name

    index = hnswlib.Index(space="ip", dim=rows.shape[1])
    index.init_index(max_elements=len(rows), M=16, ef_construction=200)
    index.set_num_threads(BUILD_THREADS)
    index.add_items(rows, np.arange(len(rows)))
    index.set_num_threads(1)
    index.set_ef(64)

    def search(q: np.ndarray) -> int:
        labels, _ = index.knn_query(q, k=1)
        return int(labels[0][0])
    return search


def _usearch(rows: np.ndarray) -> Search:
    usearch_index = importlib.import_module("usearch.index")  # no types, as hnswlib

    index = usearch_index.Index(ndim=rows.shape[1], metric="ip", dtype="f32")
    index.add(np.arange(len(rows)), rows, threads=BUILD_THREADS)

    def search(q: np.ndarray) -> int:
        return int(index.search(q, 1, threads=1).keys[0])
    return search


def _faiss(rows: np.ndarray, hnsw: bool) -> Search:
    faiss = importlib.import_module("faiss")  # no types, as hnswlib

    faiss.omp_set_num_threads(BUILD_THREADS)
    if hnsw:
        index = faiss.IndexHNSWFlat(rows.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = 64
    else:
        index = faiss.IndexFlatIP(rows.shape[1])
    index.add(rows)
    faiss.omp_set_num_threads(1)

    def search(q: np.ndarray) -> int:
        _, ids = index.search(q.reshape(1, -1), 1)
        return int(ids[0][0])
    return search


INDEXES: dict[str, tuple[str | None, Callable[[np.ndarray], Search]]] = {
    "numpy": (None, _numpy),
    "hnswlib": ("hnswlib", _hnswlib),
    "usearch": ("usearch", _usearch),
    "faiss-flat": ("faiss", lambda rows: _faiss(rows, False)),
    "faiss-hnsw": ("faiss", lambda rows: _faiss(rows, True)),
}


def _time(search: Search, queries: np.ndarray) -> tuple[list[float], list[int]]:
    lat, found = [], []
    for q in queries:
        t = time.perf_counter()
        found.append(search(q))
        lat.append(time.perf_counter() - t)
    return lat, found


def _redis_fetch(rows: np.ndarray, queries: int) -> list[float] | None:
    """Per lookup: GET the partition's matrix from Redis, then the same product (the design not taken)."""
    try:
        from tests.ratelimit.redis_server import REDIS_BIN, RedisServer
    except ImportError:
        return None
    if not os.path.exists(REDIS_BIN):
        return None
    import redis

    server = RedisServer()
    server.start()
    try:
        r = redis.Redis.from_url(server.url)
        r.set("m", rows.tobytes())
        lat = []
        for _ in range(queries):
            t = time.perf_counter()
            blob = r.get("m")
            if not isinstance(blob, bytes):  # a client without decode_responses: a key just set reads as bytes
                raise SystemExit(f"redis-fetch: GET m gave {type(blob).__name__}, not the matrix's bytes")
            m = np.frombuffer(blob, np.float32).reshape(rows.shape)
            int(np.argmax(m @ rows[0]))
            lat.append(time.perf_counter() - t)
        r.close()
    finally:
        server.stop()
    return lat


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default=scaled("10000,100000", "2000"))
    p.add_argument("--dims", default=scaled("256,768", "32"))
    p.add_argument("--queries", type=int, default=scaled(300, 30))
    p.add_argument("--rounds", type=int, default=scaled(3, 1))
    p.add_argument("--ann-max-rows", type=int, default=10_000)
    p.add_argument("--indexes", default=",".join(INDEXES), help="a comma list of " + ", ".join(INDEXES))
    a = p.parse_args(argv)
    wanted = a.indexes.split(",") if "numpy" in a.indexes.split(",") else ["numpy", *a.indexes.split(",")]
    available = {name: spec for name, spec in INDEXES.items()
                 if name in wanted and (spec[0] is None or importlib.util.find_spec(spec[0]) is not None)}
    print(f"indexes: {', '.join(available)} (not measured or not installed: {', '.join(set(INDEXES) - set(available)) or 'none'})")
    rows_out = []
    print(f"{'n':>7}{'dim':>5}  {'index':<11}{'build s':>9}{'p50 ms':>9}{'p99 ms':>9}{'recall@1':>10}{'p50 vs numpy':>14}")
    for n in (int(x) for x in a.sizes.split(",")):
        for dim in (int(x) for x in a.dims.split(",")):
            rows, queries = _data(n, dim, a.queries, seed=n + dim)
            truth: list[int] = []
            base_p50 = 0.0
            for name, (_, build) in available.items():
                if name != "numpy" and n > a.ann_max_rows:
                    continue
                t = time.perf_counter()
                search = build(rows)
                built = time.perf_counter() - t
                p50s, p99s = [], []
                for _ in range(a.rounds):  # rounds: medians of p50/p99 on a noisy box
                    lat, found = _time(search, queries)
                    p50s.append(_pct(lat, 0.5))
                    p99s.append(_pct(lat, 0.99))
                if name == "numpy":
                    truth = found
                recall = sum(f == t for f, t in zip(found, truth, strict=True)) / len(truth)
                p50, p99 = statistics.median(p50s), statistics.median(p99s)
                if name == "numpy":
                    base_p50 = p50
                print(f"{n:>7}{dim:>5}  {name:<11}{built:>9.2f}{p50:>9.3f}{p99:>9.3f}{recall:>10.3f}"
                      f"{p50 / base_p50:>14.2f}", flush=True)
                case = f"{name}-{n}x{dim}"
                rows_out += [
                    {"bench": "semantic", "case": case, "metric": "lookup_p50", "value": round(p50, 4), "unit": "ms",
                     "ratio": round(p50 / base_p50, 3)},
                    {"bench": "semantic", "case": case, "metric": "lookup_p99", "value": round(p99, 4), "unit": "ms"},
                    {"bench": "semantic", "case": case, "metric": "recall_at_1", "value": round(recall, 4),
                     "unit": "ratio"},
                    {"bench": "semantic", "case": case, "metric": "build", "value": round(built, 3), "unit": "s"}]
                del search
            # Past 10k rows the design not taken is only slower (a GET of 100 MB or more per lookup): not run.
            fetched = _redis_fetch(rows, min(a.queries, 20)) if n <= 10_000 else None
            if fetched is not None:
                p50 = _pct(fetched, 0.5)
                print(f"{n:>7}{dim:>5}  {'redis-fetch':<11}{'':>9}{p50:>9.3f}{_pct(fetched, 0.99):>9.3f}{'1.000':>10}"
                      f"{p50 / base_p50:>14.2f}", flush=True)
                rows_out.append({"bench": "semantic", "case": f"redis-fetch-{n}x{dim}", "metric": "lookup_p50",
                                 "value": round(p50, 4), "unit": "ms", "ratio": round(p50 / base_p50, 3)})
    print("SUMMARY " + orjson.dumps(rows_out).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
