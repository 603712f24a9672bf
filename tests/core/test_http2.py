"""extproc/http2.py, sans-I/O, against the h2 library as the client (a peer written elsewhere) and raw frames.

The whole server (extproc/h2_grpc.py) on it is tested with grpcio's own client in test_h2_grpc.py, and
through Envoy in tests/e2e.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hpack import Decoder, Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc import http2
from extproc.http2 import Http2Server, ProtocolError, StreamClosed

REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/svc/Call"), (":authority", "x"),
           ("content-type", "application/grpc"), ("te", "trailers")]


def _client(local: dict[int, int] | None = None) -> h2.connection.H2Connection:
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    c.initiate_connection()
    if local:
        c.update_settings(local)
    return c


def _pair(local: dict[int, int] | None = None) -> tuple[h2.connection.H2Connection, Http2Server]:
    """A client and the server, past the preface and both SETTINGS' acknowledgements."""
    c, s = _client(local), Http2Server(max_frame=1 << 20, window=4 << 20)
    _exchange(c, s)
    return c, s


def _exchange(c: h2.connection.H2Connection, s: Http2Server) -> tuple[list[tuple], list[h2.events.Event]]:
    """Bytes both ways until neither side has more; the events each side saw."""
    server_events: list[tuple] = []
    client_events: list[h2.events.Event] = []
    while True:
        up, down = c.data_to_send(), b""
        if up:
            server_events += s.receive(up)
        down = s.data_to_send()
        if down:
            client_events += c.receive_data(down)
        if not up and not down:
            return server_events, client_events


def _preface_and_settings(**settings: int) -> bytes:
    return http2.PREFACE + SettingsFrame(0, settings=settings).serialize()


def test_a_call_both_ways_with_the_client_written_elsewhere() -> None:
    c, s = _pair()
    assert s.max_outbound_frame_size == 16384
    assert c.remote_settings.max_frame_size == 1 << 20 and c.remote_settings.initial_window_size == 4 << 20
    assert c.outbound_flow_control_window == 4 << 20  # the connection's window, opened at once
    c.send_headers(1, REQUEST)
    c.send_data(1, b"\x00\x00\x00\x00\x02hi", end_stream=True)
    got, _ = _exchange(c, s)
    assert got[0][:2] == (http2.REQUEST, 1)
    assert [(bytes(k), bytes(v)) for k, v in got[0][2]][:3] == [(b":method", b"POST"), (b":scheme", b"http"),
                                                              (b":path", b"/svc/Call")]
    assert got[1:] == [(http2.DATA_RECEIVED, 1, b"\x00\x00\x00\x00\x02hi"), (http2.ENDED, 1)]
    s.send_headers(1, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    s.send_data(1, b"\x00\x00\x00\x00\x02ok")
    s.send_headers(1, [(b"grpc-status", b"0"), (b"grpc-message", b"fine")], end_stream=True)
    _, seen = _exchange(c, s)
    kinds = [type(e) for e in seen]
    assert kinds == [h2.events.ResponseReceived, h2.events.DataReceived, h2.events.TrailersReceived,
                     h2.events.StreamEnded]
    assert seen[0].headers == [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert seen[1].data == b"\x00\x00\x00\x00\x02ok"
    assert seen[2].headers == [(b"grpc-status", b"0"), (b"grpc-message", b"fine")]
    assert s.streams == {}  # both halves closed: nothing kept


def test_the_header_coding_leaves_the_tables_alone_and_takes_long_names() -> None:
    long = b"x" * 300
    block = http2.encode_headers([(b":status", b"200"), (b"grpc-message", long), (b"content-type", b"a" * 200)])
    d = Decoder()
    assert d.decode(block, raw=True) == [(b":status", b"200"), (b"grpc-message", long), (b"content-type", b"a" * 200)]
    assert len(d.header_table.dynamic_entries) == 0


def test_headers_past_the_peers_frame_size_go_in_continuations() -> None:
    c, s = _pair()
    c.send_headers(1, REQUEST, end_stream=True)
    _exchange(c, s)
    message = b"m" * 40000  # over the client's 16 KiB frames
    s.send_headers(1, [(b":status", b"200"), (b"grpc-status", b"13"), (b"grpc-message", message)], end_stream=True)
    _, seen = _exchange(c, s)
    assert dict(seen[0].headers)[b"grpc-message"] == message


def test_a_request_in_continuations_padding_and_priority() -> None:
    s = Http2Server()
    s.receive(_preface_and_settings())
    block = Encoder().encode(REQUEST + [("x-long", "v" * 100)])
    first = HeadersFrame(1, data=block[:10], flags=["PADDED", "PRIORITY"], pad_length=7, depends_on=0,
                         stream_weight=15)
    rest = [ContinuationFrame(1, data=block[10:50]), ContinuationFrame(1, data=block[50:], flags=["END_HEADERS"])]
    data = DataFrame(1, data=b"abc", flags=["PADDED", "END_STREAM"], pad_length=20)
    wire = b"".join(f.serialize() for f in [first, *rest, data])
    got = []
    for i in range(len(wire)):  # a byte at a time: every frame split everywhere
        got += s.receive(wire[i:i + 1])
    assert got[0][:2] == (http2.REQUEST, 1) and (b"x-long", b"v" * 100) in got[0][2]
    assert got[1:] == [(http2.DATA_RECEIVED, 1, b"abc"), (http2.ENDED, 1)]


def test_ping_is_answered_and_settings_acknowledged() -> None:
    s = Http2Server()
    s.receive(_preface_and_settings())
    s.data_to_send()
    s.receive(PingFrame(0, opaque_data=b"12345678").serialize())
    assert s.data_to_send() == PingFrame(0, opaque_data=b"12345678", flags=["ACK"]).serialize()
    s.receive(PingFrame(0, opaque_data=b"12345678", flags=["ACK"]).serialize())
    s.receive(SettingsFrame(0, settings={http2.MAX_FRAME_SIZE: 20000}).serialize())
    assert s.data_to_send() == SettingsFrame(0, flags=["ACK"]).serialize()
    assert s.max_outbound_frame_size == 20000


def test_the_peers_windows_limit_what_is_sent_and_updates_reopen_them() -> None:
    c, s = _pair({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10})
    c.send_headers(1, REQUEST)
    _exchange(c, s)
    assert s.local_flow_control_window(1) == 10
    s.send_headers(1, [(b":status", b"200")])
    s.send_data(1, b"0123456789")
    assert s.local_flow_control_window(1) == 0
    with pytest.raises(http2.Http2Error):
        s.send_data(1, b"x")
    got, seen = _exchange(c, s)
    c.acknowledge_received_data(10, 1)
    got, _ = _exchange(c, s)
    assert (http2.WINDOW_OPENED, 1) in got and s.local_flow_control_window(1) == 10
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})  # applies to open streams too
    got, _ = _exchange(c, s)
    assert s.local_flow_control_window(1) == 100 and (http2.WINDOW_OPENED, 0) in got


def test_what_the_peer_sends_is_handed_back_to_it_at_half_the_window() -> None:
    c, s = _pair()
    c.send_headers(1, REQUEST)
    _exchange(c, s)
    sent = 0
    while sent < 6 << 20:  # past the 4 MiB windows: the client would stall without updates
        n = min(c.local_flow_control_window(1), c.max_outbound_frame_size)
        assert n > 0, f"the client's window closed after {sent} bytes"
        c.send_data(1, b"\x00" * n)
        sent += n
        got, _ = _exchange(c, s)
        assert sum(len(e[2]) for e in got if e[0] == http2.DATA_RECEIVED) == n


def test_data_past_the_window_is_a_flow_control_error() -> None:
    s = Http2Server(max_frame=1 << 20, window=1000)  # no smaller than HTTP/2's default in fact: 65,535
    s.receive(_preface_and_settings() + HeadersFrame(1, Encoder().encode(REQUEST), flags=["END_HEADERS"]).serialize())
    assert s.receive(DataFrame(1, data=b"x" * 65535).serialize())[0][:2] == (http2.DATA_RECEIVED, 1)
    s = Http2Server(max_frame=1 << 20)
    s.receive(_preface_and_settings() + HeadersFrame(1, Encoder().encode(REQUEST), flags=["END_HEADERS"]).serialize())
    with pytest.raises(ProtocolError) as e:
        s.receive(DataFrame(1, data=b"x" * 65536).serialize())
    assert e.value.code == http2.FLOW_CONTROL_ERROR


def test_resets_and_goaway_from_the_peer() -> None:
    c, s = _pair()
    c.send_headers(1, REQUEST)
    c.send_headers(3, REQUEST)
    _exchange(c, s)
    c.reset_stream(1)
    got, _ = _exchange(c, s)
    assert got == [(http2.RESET, 1, 0)]
    with pytest.raises(StreamClosed):
        s.send_headers(1, [(b":status", b"200")])
    c.close_connection()
    got, _ = _exchange(c, s)
    assert got == [(http2.GOAWAY_RECEIVED, 0, 0)]


def test_the_server_resets_and_closes() -> None:
    c, s = _pair()
    c.send_headers(1, REQUEST)
    _exchange(c, s)
    s.reset_stream(1, http2.CANCEL)
    _, seen = _exchange(c, s)
    assert isinstance(seen[0], h2.events.StreamReset) and seen[0].error_code == http2.CANCEL
    window = s._recv_window
    # DATA in flight when the reset crossed it: dropped, the connection's window still counted
    assert s.receive(DataFrame(1, data=b"late").serialize()) == [] and s._recv_window == window - 4
    s.close(http2.NO_ERROR, b"bye")
    _, seen = _exchange(c, s)
    assert isinstance(seen[0], h2.events.ConnectionTerminated) and seen[0].last_stream_id == 1
    late = HeadersFrame(3, Encoder().encode(REQUEST), flags=["END_HEADERS"]).serialize()
    assert s.receive(late) == [] and 3 not in s.streams  # a stream after the GOAWAY: not taken


def test_trailers_from_the_client_end_its_half() -> None:
    c, s = _pair()
    c.send_headers(1, REQUEST)
    c.send_data(1, b"body")
    c.send_headers(1, [("x-trailer", "t")], end_stream=True)
    got, _ = _exchange(c, s)
    assert got[1:] == [(http2.DATA_RECEIVED, 1, b"body"), (http2.ENDED, 1)]


def _raw(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return http2.frame_header(len(payload), kind, flags, sid) + payload


@pytest.mark.parametrize("wire, code", [
    (_raw(http2.DATA, 0, 0, b"x"), http2.PROTOCOL_ERROR),  # DATA on the connection
    (_raw(http2.DATA, 0, 5, b"x"), http2.PROTOCOL_ERROR),  # on a stream never opened
    (_raw(http2.HEADERS, http2.END_HEADERS, 2, Encoder().encode(REQUEST)), http2.PROTOCOL_ERROR),  # an even stream
    (_raw(http2.CONTINUATION, http2.END_HEADERS, 1, b""), http2.PROTOCOL_ERROR),  # continuing nothing
    (_raw(http2.WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), http2.PROTOCOL_ERROR),
    (WindowUpdateFrame(0, window_increment=(1 << 31) - 1).serialize(), http2.FLOW_CONTROL_ERROR),
    (_raw(http2.RST_STREAM, 0, 0, b"\0\0\0\0"), http2.PROTOCOL_ERROR),
    (_raw(http2.GOAWAY, 0, 1, b"\0" * 8), http2.PROTOCOL_ERROR),
    (_raw(http2.SETTINGS, 0, 0, b"\0\x05\0\0\0\x64"), http2.PROTOCOL_ERROR),  # a frame size of 100
    (_raw(http2.SETTINGS, 0, 0, b"\0\x04\x80\0\0\0"), http2.FLOW_CONTROL_ERROR),  # a window of 2^31
    (_raw(http2.PUSH_PROMISE, http2.END_HEADERS, 1, b"\0\0\0\x02"), http2.PROTOCOL_ERROR),
    (_raw(http2.PING, 0, 0, b"1234"), http2.FRAME_SIZE_ERROR),
])
def test_what_a_client_may_not_send_ends_the_connection_with_its_goaway(wire: bytes, code: int) -> None:
    s = Http2Server()
    s.receive(_preface_and_settings())
    s.data_to_send()
    with pytest.raises(ProtocolError) as e:
        s.receive(wire)
    assert e.value.code == code
    goaway = s.data_to_send()
    assert goaway[3] == http2.GOAWAY and int.from_bytes(goaway[13:17], "big") == code


def test_a_frame_over_the_limit_a_bad_preface_and_a_header_block_cut_short() -> None:
    s = Http2Server(max_frame=16384)
    s.receive(_preface_and_settings())
    with pytest.raises(ProtocolError) as e:
        s.receive(DataFrame(1, data=b"x" * 16385).serialize())
    assert e.value.code == http2.FRAME_SIZE_ERROR
    with pytest.raises(ProtocolError):
        Http2Server().receive(b"GET / HTTP/1.1\r\n")
    with pytest.raises(ProtocolError):  # a frame before the client's SETTINGS
        Http2Server().receive(http2.PREFACE + PingFrame(0).serialize())
    s = Http2Server()
    s.receive(_preface_and_settings())
    with pytest.raises(ProtocolError):  # HEADERS without END_HEADERS, then something else
        s.receive(HeadersFrame(1, b"\x82").serialize() + PingFrame(0).serialize())
    s = Http2Server()
    s.receive(_preface_and_settings())
    with pytest.raises(ProtocolError) as e:  # an index past both tables
        s.receive(HeadersFrame(1, b"\xff\x7f", flags=["END_HEADERS"]).serialize())
    assert e.value.code == http2.COMPRESSION_ERROR


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_any_bytes_after_the_preface_are_events_or_a_protocol_error(chunks: list[bytes]) -> None:
    s = Http2Server()
    s.receive(_preface_and_settings())
    try:
        for chunk in chunks:
            for ev in s.receive(chunk):
                assert ev[0] in range(6)
    except ProtocolError as e:
        assert s.closed and e.code >= 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(10)), st.integers(0, 255), st.sampled_from([0, 1, 2, 3, 5]),
                          st.binary(max_size=24)), max_size=10))
def test_any_frames_are_events_or_a_protocol_error(frames: list[tuple[int, int, int, bytes]]) -> None:
    s = Http2Server()
    wire = _preface_and_settings() + b"".join(http2.frame_header(len(p), k, f, sid) + p for k, f, sid, p in frames)
    try:
        s.receive(wire)
    except ProtocolError:
        assert s.closed


def test_headers_on_a_stream_already_reset_are_dropped_but_still_decoded() -> None:
    enc = Encoder()
    s = Http2Server()
    s.receive(_preface_and_settings() + HeadersFrame(1, enc.encode(REQUEST), flags=["END_HEADERS"]).serialize())
    s.reset_stream(1, http2.CANCEL)
    late = enc.encode([("x-trailer", "t1")])  # indexed by the peer's table: ours must follow it
    assert s.receive(HeadersFrame(1, late, flags=["END_HEADERS", "END_STREAM"]).serialize()) == []
    got = s.receive(HeadersFrame(3, enc.encode(REQUEST + [("x-trailer", "t1")]), flags=["END_HEADERS"]).serialize())
    assert got[0][:2] == (http2.REQUEST, 3) and got[0][2][-1] == (b"x-trailer", b"t1")


def test_header_blocks_are_decoded_once_while_what_they_say_cannot_change() -> None:
    s = Http2Server()
    s.receive(_preface_and_settings())
    reference = Decoder()  # the same blocks in the same order: what each must decode to
    enc = Encoder()
    static = http2.encode_headers([(k.encode(), v.encode()) for k, v in REQUEST])
    adds = enc.encode(REQUEST + [("x-a", "1")])  # literals the table keeps (Envoy's first block on a connection)
    reads = enc.encode(REQUEST + [("x-a", "1")])  # the same by their indexes (Envoy's every block after it)
    other = Encoder().encode([("x-b", "2")])  # adds x-b: reads' indexes now name other entries
    order = [static, static, adds, reads, reads, other, reads, adds, reads, reads]
    got = []
    for sid, block in enumerate(order):
        want = tuple(reference.decode(block, raw=True))
        events = s.receive(HeadersFrame(2 * sid + 1, block, flags=["END_HEADERS"]).serialize())
        assert events[0][2] == want, sid
        got.append(events[0][2])
    assert got[6][-1] == (b"x-b", b"2") and got[6] != got[3]  # decoded again once the table moved
    assert got[8] == got[3]  # after `adds` came again, from the kept: its entries were added all the same
    assert got[0] is got[1] and got[2] is got[7] and got[3] is got[4] and got[8] is got[9]  # decoded once each
    assert s._blocks[reads][2] == s._table.version  # kept for the table as it is now
    assert list(s._table.dynamic_entries) == list(reference.header_table.dynamic_entries)
