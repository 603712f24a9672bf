"""The demo KServe server in-process on a free port, called through real gRPC."""

from __future__ import annotations

import aiohttp
import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from adapters import kserve
from adapters.images import decode_images
from adapters.multipart import parse_multipart, read_classify_form
from contracts.config import TensorInput
from devstack.demo.kserve_server import ColourModel, start
from kernels import PreprocessSpec, preprocess
from tests.vision.formgen import build_form
from tests.vision.imagegen import encode

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0),
           "white": (255, 255, 255), "black": (0, 0, 0), "cyan": (0, 255, 255), "magenta": (255, 0, 255)}


@pytest.fixture
async def server():
    s = await start(0, stats_port=0, models=["demo-colors"], fixed_ms=1, per_image_ms=0.1)
    yield s
    await s.stop(0)


@pytest.fixture
async def stub(server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        await ch.channel_ready()
        yield pb_grpc.GRPCInferenceServiceStub(ch)


def _squares(names, size=(40, 30)):
    return [np.full((size[1], size[0], 3), COLOURS[n], np.uint8) for n in names]


@pytest.mark.parametrize("datatype,order", [("FP32", "RGB"), ("FP16", "RGB"), ("FP32", "BGR")])
async def test_colour_squares_come_back_right(datatype, order):
    s = await start(0, model=ColourModel(channel_order=order))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{s.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            names = ["red", "green", "blue", "yellow", "white", "black"]
            ti = TensorInput(width=16, height=16, datatype=datatype, channel_order=order)
            x = preprocess(_squares(names), PreprocessSpec.from_tensor_input(ti))
            resp = await stub.ModelInfer(kserve.build_classify_request("demo-colors", x, ti))
        labels = ["red", "green", "blue", "white", "black", "yellow", "cyan", "magenta"]
        res = kserve.parse_classify_response(resp, labels, top_k=3, expected=len(names))
        assert [r[0]["label"] for r in res] == names
        assert all(r[0]["score"] == 1.0 for r in res)
    finally:
        await s.stop(0)


async def test_typed_contents_and_metadata(stub):
    x = preprocess(_squares(["blue"]), PreprocessSpec(width=4, height=4))
    req = pb.ModelInferRequest(model_name="demo-colors")
    t = req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    t.contents.fp32_contents.extend(x.ravel().tolist())
    resp = await stub.ModelInfer(req)
    assert np.frombuffer(resp.raw_output_contents[0], "<f4").argmax() == 2
    md = await stub.ModelMetadata(pb.ModelMetadataRequest(name="demo-colors"))
    assert md.outputs[0].name == "scores" and list(md.outputs[0].shape) == [-1, 8]
    assert (await stub.ServerLive(pb.ServerLiveRequest())).live
    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="demo-colors"))).ready
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name="nope"))).ready


@pytest.mark.parametrize("make,code", [
    (lambda r: setattr(r, "model_name", "nope"), grpc.StatusCode.NOT_FOUND),
    (lambda r: r.inputs[0].__setattr__("datatype", "INT8"), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda r: r.raw_input_contents.__setitem__(0, b"\x00" * 7), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda r: r.inputs[0].shape.__setitem__(1, 4), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda r: r.outputs.add(name="other"), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda r: r.parameters["demo_fail_code"].__setattr__("int64_param", 8), grpc.StatusCode.RESOURCE_EXHAUSTED),
])
async def test_errors_are_grpc_statuses(stub, make, code):
    x = preprocess(_squares(["red"]), PreprocessSpec(width=4, height=4))
    req = kserve.build_classify_request("demo-colors", x, TensorInput())
    make(req)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ModelInfer(req)
    assert e.value.code() == code
    assert kserve.grpc_status_to_http(code.value[0]) in (400, 404, 429)


async def test_stats_count_calls_and_images(server, stub):
    x = preprocess(_squares(["red", "green", "blue"]), PreprocessSpec(width=8, height=8))
    for _ in range(2):
        await stub.ModelInfer(kserve.build_classify_request("demo-colors", x, TensorInput()))
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{server.stats_port}/stats") as r:
        assert await r.json() == {"calls": 2, "images": 6, "failures": 0, "seq_lens": [], "versions": ["", ""]}


async def test_fail_next_then_recovers():
    s = await start(0, fail_next=1)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{s.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            req = kserve.build_classify_request("demo-colors", preprocess(_squares(["red"]), PreprocessSpec(width=4, height=4)), TensorInput())
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.ModelInfer(req)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert (await stub.ModelInfer(req)).outputs[0].name == "scores"
    finally:
        await s.stop(0)


async def test_tritonclient_aio_against_demo(server):
    from tritonclient.grpc import aio as tc

    client = tc.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        assert await client.is_server_live()
        x = preprocess(_squares(["magenta", "cyan"]), PreprocessSpec(width=8, height=8))
        inp = tc.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = await client.infer("demo-colors", [inp], outputs=[tc.InferRequestedOutput("scores")])
        assert result.as_numpy("scores").argmax(1).tolist() == [7, 6]
    finally:
        await client.close()


async def test_multipart_to_demo_end_to_end(server, stub):
    """The whole pure path the extproc will run: form -> decode -> kernels -> ModelInfer -> JSON."""
    fields = [("model", "demo-colors", None, None), ("top_k", "2", None, None)]
    for name, fmt in [("red", "PNG"), ("green", "JPEG"), ("blue", "WEBP")]:
        fields.append(("image", encode(COLOURS[name], (50, 40), fmt), f"{name}.{fmt.lower()}", f"image/{fmt.lower()}"))
    body, ct = build_form(fields)
    form = read_classify_form(parse_multipart(body, ct))
    images = decode_images(form.images, max_images=16)
    ti = TensorInput(width=32, height=32)
    tensor = preprocess(images, PreprocessSpec.from_tensor_input(ti))
    wire = kserve.encode_infer_request(kserve.build_classify_request("demo-colors", tensor, ti))
    req = pb.ModelInferRequest.FromString(kserve.unframe(wire))
    resp = await stub.ModelInfer(req)
    results = kserve.parse_classify_response(resp, ["red", "green", "blue", "white", "black", "yellow", "cyan", "magenta"],
                                             form.top_k, expected=len(images))
    assert [r[0]["label"] for r in results] == ["red", "green", "blue"] and all(len(r) == 2 for r in results)
    # And as the JSON the REST infer path would render:
    assert kserve.infer_response_dict(resp)["outputs"][0]["shape"] == [3, 8]


async def test_cli_process_serves_and_stops_on_sigterm():
    import asyncio
    import socket
    import sys

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    port, stats_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devstack.demo.kserve_server", "--port", str(port), "--stats-port", str(stats_port),
        "--fixed-ms", "1", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            await asyncio.wait_for(ch.channel_ready(), 20)
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            x = preprocess(_squares(["green"]), PreprocessSpec(width=8, height=8))
            resp = await stub.ModelInfer(kserve.build_classify_request("demo-colors", x, TensorInput()))
            assert np.frombuffer(resp.raw_output_contents[0], "<f4").argmax() == 1
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{stats_port}/stats") as r:
            assert (await r.json())["calls"] == 1
    finally:
        proc.terminate()
        rc = await asyncio.wait_for(proc.wait(), 10)
    assert rc == 0, (await proc.stderr.read()).decode()
