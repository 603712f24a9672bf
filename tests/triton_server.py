"""NVIDIA Triton (through nvidia-pytriton, CPU) serving `double`: y = 2x, FP32, dynamic batch; and
`textlen`, a text model: BYTES `text` [N, 1] -> FP32 `features` [N, 2] = (UTF-8 length, byte sum).

Run by the pytriton venv's Python (`make pytriton`): python tests/triton_server.py HTTP GRPC METRICS
"""

from __future__ import annotations

import sys

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


@batch
def double(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": (x * 2).astype(np.float32)}


@batch
def textlen(text: np.ndarray) -> dict[str, np.ndarray]:
    rows = [(len(bytes(t[0])), sum(bytes(t[0]))) for t in text]
    return {"features": np.array(rows, dtype=np.float32)}


def main() -> None:
    http, grpc_port, metrics = (int(a) for a in sys.argv[1:4])
    cfg = TritonConfig(http_address="127.0.0.1", http_port=http, grpc_address="127.0.0.1", grpc_port=grpc_port,
                       metrics_port=metrics)
    with Triton(config=cfg) as triton:
        triton.bind(model_name="double", infer_func=double, inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))], config=ModelConfig(max_batch_size=16))
        triton.bind(model_name="textlen", infer_func=textlen, inputs=[Tensor(name="text", dtype=np.bytes_, shape=(1,))],
                    outputs=[Tensor(name="features", dtype=np.float32, shape=(2,))],
                    config=ModelConfig(max_batch_size=32))
        triton.serve()


if __name__ == "__main__":
    main()
