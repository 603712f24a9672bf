"""HTTP/2's server side as the extproc's gRPC socket needs it: frames, HPACK, flow control (RFC 9113).

Sans-I/O: `receive(bytes)` returns events (tuples: the kind first, then the stream), the replies are
framed by `send_headers` (or `send_block`, a block coded once beforehand), `send_data`, `reset_stream`
and `close`, and `data_to_send()` hands back the bytes to write. It replaces the h2 library under extproc/h2_grpc.py: h2 runs a general state machine
per frame and an event object per frame, a fifth of the extproc's CPU per call on the socket's four
small messages each way (docs/performance.md, "Issue 38, twelfth pass"). What a client may send is all
handled: PADDED and PRIORITY flags, CONTINUATION, SETTINGS and their acknowledgement, PING,
WINDOW_UPDATE both ways, RST_STREAM, GOAWAY, trailers, frames of unknown types (ignored). What it may
not send is a connection error (`ProtocolError`, its GOAWAY queued) or a stream's (RST_STREAM, reported
as a reset). HPACK decoding is the hpack library's (its dynamic table); what the server sends is coded
without the dynamic table (indexed or literal-without-indexing), so the peer's table size never matters.
"""

from __future__ import annotations

import struct
from typing import Any

from hpack import Decoder
from hpack.exceptions import HPACKError
from hpack.hpack import encode_integer
from hpack.table import HeaderTable

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Error codes.
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11

# Settings.
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5

# Events: (REQUEST, stream, headers: a tuple of (name, value) bytes pairs), (DATA_RECEIVED, stream, payload),
# (ENDED, stream), (RESET, stream, code), (WINDOW_OPENED, stream or 0 for the connection),
# (GOAWAY_RECEIVED, 0, code).
REQUEST, DATA_RECEIVED, ENDED, RESET, WINDOW_OPENED, GOAWAY_RECEIVED = range(6)

DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
MAX_WINDOW = (1 << 31) - 1
MAX_HEADER_BLOCK = 1 << 20  # a header block and its CONTINUATIONs, before HPACK's own list limit
KEPT_BLOCKS = 64  # header blocks kept decoded (Envoy's gRPC client sends one for all of a connection's streams)

_HEAD = struct.Struct(">HBBBL")  # the 24-bit length as 16 + 8 bits, type, flags, stream (its top bit reserved)
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")


class Http2Error(Exception):
    pass


class ProtocolError(Http2Error):
    """The peer broke the protocol: the connection ends (its GOAWAY is queued to send)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class StreamClosed(Http2Error):
    """Nothing more may be sent on that stream (reset, ended, never opened)."""


def frame_header(length: int, kind: int, flags: int, sid: int) -> bytes:
    return _HEAD.pack(length >> 8, length & 0xFF, kind, flags, sid)


def _integer(value: int, prefix_bits: int, first: int) -> bytearray:
    """HPACK's integer (RFC 7541 5.1) in a `prefix_bits` prefix, with `first`'s high bits set."""
    out = encode_integer(value, prefix_bits)
    out[0] |= first
    return out


_STATIC = HeaderTable.STATIC_TABLE_MAPPING  # name -> (its index, {value: the full entry's index})


def encode_headers(headers: Any) -> bytes:
    """A header block that leaves both dynamic tables alone: a static entry's index, else a literal
    not indexed (the name by index when the static table has it), strings without Huffman coding."""
    out = bytearray()
    for name, value in headers:
        index, values = _STATIC.get(name, (0, {}))
        if value in values:
            out += _integer(values[value], 7, 0x80)
            continue
        out += _integer(index, 4, 0x00)
        if not index:
            out += _integer(len(name), 7, 0x00) + name
        out += _integer(len(value), 7, 0x00) + value
    return bytes(out)


class _WatchedTable(HeaderTable):
    """The decoder's dynamic table, watched (`Http2Server._decode`): a block that read none of its entries
    decodes to the same headers every time, and what it did to the table (`changes`) can be done again
    without decoding it; one that read entries but changed none decodes the same while `version` stays.
    Envoy's gRPC client sends the first kind on a connection's first stream, then the second on each."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.version = 0  # one more at each change
        self.changes: list[tuple[bytes | None, bytes | int]] = []  # (name, value) added, or (None, new size)

    def get_by_index(self, index: int) -> tuple[bytes, bytes]:
        if index > HeaderTable.STATIC_TABLE_LENGTH:
            self.reads += 1
        return super().get_by_index(index)

    def add(self, name: bytes, value: bytes) -> None:
        self.changes.append((name, value))
        self.version += 1
        super().add(name, value)

    @property
    def maxsize(self) -> int:
        return self._maxsize

    @maxsize.setter
    def maxsize(self, value: int) -> None:
        self.changes.append((None, value))
        self.version += 1
        _resize(self, value)


_resize = HeaderTable.maxsize.fset  # type: ignore[attr-defined]


class _Stream:
    __slots__ = ("window", "remote_open", "local_open", "unacked")

    def __init__(self, window: int) -> None:
        self.window = window  # what we may still send on it
        self.remote_open = True
        self.local_open = True
        self.unacked = 0  # bytes received since the last WINDOW_UPDATE we sent for it


class Http2Server:
    """One server connection's HTTP/2: the preface, settings and windows it opens with are queued at once.
    `max_frame` and `window` are what it takes: frames up to that size and that much in flight per stream
    and on the connection (topped up when half of it has been received)."""

    def __init__(self, max_frame: int = DEFAULT_FRAME, window: int = DEFAULT_WINDOW,
                 max_streams: int = MAX_WINDOW) -> None:
        self.max_inbound_frame = max_frame
        self.window = window
        self.max_outbound_frame_size = DEFAULT_FRAME  # the peer's, from its SETTINGS
        self._peer_window = DEFAULT_WINDOW  # the peer's initial stream window
        self._send_window = DEFAULT_WINDOW  # the connection's, for what we send
        # What the peer may still send on the connection, and on a stream before its WINDOW_UPDATE: never
        # under HTTP/2's default, which a peer uses until it has our SETTINGS (windows only grow by updates).
        self._recv_window = self._stream_limit = max(window, DEFAULT_WINDOW)
        self._unacked = 0
        self.streams: dict[int, _Stream] = {}
        self.last_stream = 0
        self.closed = False  # a GOAWAY went out: nothing more is sent, no new streams are taken
        self._decoder = Decoder()
        self._table = self._decoder.header_table = _WatchedTable()
        self._blocks: dict[bytes, tuple[tuple[tuple[bytes, bytes], ...], tuple, int | None]] = {}
        self._buf = bytearray()
        self._preface = False
        self._settings_seen = False
        self._block: bytearray | None = None  # a header block waiting for its CONTINUATIONs
        self._block_stream = 0
        self._block_end = False
        self._out = bytearray()
        settings = b"".join(_SETTING.pack(k, v) for k, v in (
            (ENABLE_PUSH, 0), (MAX_CONCURRENT_STREAMS, max_streams), (INITIAL_WINDOW_SIZE, window),
            (MAX_FRAME_SIZE, max_frame)))
        self._out += frame_header(len(settings), SETTINGS, 0, 0) + settings
        if window > DEFAULT_WINDOW:
            self._window_update(0, window - DEFAULT_WINDOW)

    # What goes out.

    def data_to_send(self) -> bytearray:
        out, self._out = self._out, bytearray()  # handed over whole: not copied, never written to again
        return out

    def local_flow_control_window(self, sid: int) -> int:
        s = self.streams.get(sid)
        if s is None or not s.local_open:
            raise StreamClosed(f"stream {sid} is closed")
        return min(s.window, self._send_window)

    def send_headers(self, sid: int, headers: Any, end_stream: bool = False) -> None:
        """`headers`, (name, value) bytes pairs, coded by `encode_headers`."""
        self.send_block(sid, encode_headers(headers), end_stream)

    def send_block(self, sid: int, block: bytes, end_stream: bool = False) -> None:
        """A header block `encode_headers` coded (reply headers coded once for every call), CONTINUATIONs past
        the peer's frame size."""
        s = self._sending(sid)
        flags = END_STREAM if end_stream else 0
        size = self.max_outbound_frame_size
        if len(block) <= size:
            self._out += frame_header(len(block), HEADERS, flags | END_HEADERS, sid)
            self._out += block
        else:
            self._out += frame_header(size, HEADERS, flags, sid)
            self._out += block[:size]
            for at in range(size, len(block), size):
                part = block[at:at + size]
                last = at + size >= len(block)
                self._out += frame_header(len(part), CONTINUATION, END_HEADERS if last else 0, sid)
                self._out += part
        if end_stream:
            self._close_local(sid, s)

    def send_data(self, sid: int, data: bytes, end_stream: bool = False) -> None:
        """`data` in one frame: the caller keeps it within `local_flow_control_window` and the frame size."""
        s = self._sending(sid)
        n = len(data)
        if n > min(s.window, self._send_window) or n > self.max_outbound_frame_size:
            raise Http2Error(f"{n} bytes do not fit the peer's window or frame on stream {sid}")
        s.window -= n
        self._send_window -= n
        self._out += frame_header(n, DATA, END_STREAM if end_stream else 0, sid)
        self._out += data
        if end_stream:
            self._close_local(sid, s)

    def reset_stream(self, sid: int, code: int = NO_ERROR) -> None:
        if self.streams.pop(sid, None) is None or self.closed:
            raise StreamClosed(f"stream {sid} is closed")
        self._rst(sid, code)

    def close(self, code: int = NO_ERROR, debug: bytes = b"") -> None:
        """GOAWAY: the last stream taken, and nothing more from this side."""
        if self.closed:
            return
        self.closed = True
        payload = _U32.pack(self.last_stream) + _U32.pack(code) + debug
        self._out += frame_header(len(payload), GOAWAY, 0, 0) + payload

    def _sending(self, sid: int) -> _Stream:
        s = self.streams.get(sid)
        if s is None or not s.local_open or self.closed:
            raise StreamClosed(f"stream {sid} is closed")
        return s

    def _close_local(self, sid: int, s: _Stream) -> None:
        s.local_open = False
        if not s.remote_open:
            del self.streams[sid]

    def _rst(self, sid: int, code: int) -> None:
        self._out += frame_header(4, RST_STREAM, 0, sid) + _U32.pack(code)

    def _window_update(self, sid: int, n: int) -> None:
        self._out += frame_header(4, WINDOW_UPDATE, 0, sid) + _U32.pack(n)

    # What comes in.

    def receive(self, data: bytes) -> list[tuple]:
        """The events in `data` (with what earlier reads left unfinished). A `ProtocolError` ends the
        connection: its GOAWAY is queued, and nothing else should be fed."""
        try:
            return self._receive(data)
        except ProtocolError as e:
            self.close(e.code, str(e).encode()[:256])
            raise
        except HPACKError as e:  # the header table is now out of step with the peer's: nothing can follow
            self.close(COMPRESSION_ERROR)
            raise ProtocolError(COMPRESSION_ERROR, f"header block: {e}") from None

    def _receive(self, data: bytes) -> list[tuple]:
        events: list[tuple] = []
        if self._buf:
            self._buf += data
            buf: bytes | bytearray = self._buf
        else:
            buf = data
        at = 0
        end = len(buf)
        if not self._preface:
            if end < len(PREFACE):
                if PREFACE[:end] != buf[:end]:
                    raise ProtocolError(PROTOCOL_ERROR, "not the HTTP/2 connection preface")
                self._keep(buf, 0)
                return events
            if buf[:len(PREFACE)] != PREFACE:
                raise ProtocolError(PROTOCOL_ERROR, "not the HTTP/2 connection preface")
            self._preface = True
            at = len(PREFACE)
        limit = self.max_inbound_frame
        while end - at >= 9:
            hi, lo, kind, flags, sid = _HEAD.unpack_from(buf, at)
            length = (hi << 8) | lo
            if length > limit:
                raise ProtocolError(FRAME_SIZE_ERROR, f"a frame of {length} bytes (the limit is {limit})")
            if end - at - 9 < length:
                break
            payload = buf[at + 9:at + 9 + length]
            at += 9 + length
            sid &= MAX_WINDOW
            if not self._settings_seen:
                if kind != SETTINGS or flags & ACK:
                    raise ProtocolError(PROTOCOL_ERROR, "the connection must begin with SETTINGS")
                self._settings_seen = True
            if self._block is not None and kind != CONTINUATION:
                raise ProtocolError(PROTOCOL_ERROR, "a header block interrupted before its end")
            if kind == DATA:
                self._data(sid, flags, payload, events)
            elif kind == HEADERS:
                self._headers(sid, flags, payload, events)
            elif kind == CONTINUATION:
                self._continuation(sid, flags, payload, events)
            elif kind == WINDOW_UPDATE:
                self._window(sid, payload, events)
            elif kind == RST_STREAM:
                self._reset(sid, payload, events)
            elif kind == SETTINGS:
                self._settings(sid, flags, payload, events)
            elif kind == PING:
                if sid or length != 8:
                    raise ProtocolError(PROTOCOL_ERROR if sid else FRAME_SIZE_ERROR, "a malformed PING")
                if not flags & ACK:
                    self._out += frame_header(8, PING, ACK, 0) + payload
            elif kind == GOAWAY:
                if sid or length < 8:
                    raise ProtocolError(PROTOCOL_ERROR if sid else FRAME_SIZE_ERROR, "a malformed GOAWAY")
                events.append((GOAWAY_RECEIVED, 0, _U32.unpack_from(payload, 4)[0]))
            elif kind == PRIORITY:
                if not sid:
                    raise ProtocolError(PROTOCOL_ERROR, "PRIORITY on the connection")
            elif kind == PUSH_PROMISE:
                raise ProtocolError(PROTOCOL_ERROR, "a client may not push")
            # any other type: an extension this server does not know, ignored (RFC 9113 5.5)
        self._keep(buf, at)
        return events

    def _keep(self, buf: bytes | bytearray, at: int) -> None:
        """What is left of `buf` from `at`: the start of a frame still coming."""
        if buf is self._buf:
            del self._buf[:at]
        elif at < len(buf):
            self._buf = bytearray(buf[at:])

    def _unpad(self, flags: int, payload: bytes | bytearray) -> bytes | bytearray:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise ProtocolError(PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1:len(payload) - payload[0]]
        return payload

    def _data(self, sid: int, flags: int, payload: bytes | bytearray, events: list[tuple]) -> None:
        if not sid:
            raise ProtocolError(PROTOCOL_ERROR, "DATA on the connection")
        n = len(payload)
        self._recv_window -= n
        if self._recv_window < 0:
            raise ProtocolError(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        self._unacked += n
        if self._unacked >= self.window >> 1:  # flow control counts the whole frame, padding too
            self._window_update(0, self._unacked)
            self._recv_window += self._unacked
            self._unacked = 0
        s = self.streams.get(sid)
        if s is None or not s.remote_open:
            if sid > self.last_stream:
                raise ProtocolError(PROTOCOL_ERROR, f"DATA on stream {sid}, never opened")
            if s is not None:  # the peer ended it and sends more: a stream error
                del self.streams[sid]
                self._rst(sid, STREAM_CLOSED)
                events.append((RESET, sid, STREAM_CLOSED))
            return  # else closed (reset, or both sides done): frames in flight are dropped
        s.unacked += n
        if s.unacked > self._stream_limit:
            del self.streams[sid]
            self._rst(sid, FLOW_CONTROL_ERROR)
            events.append((RESET, sid, FLOW_CONTROL_ERROR))
            return
        body = self._unpad(flags, payload)
        if body:
            events.append((DATA_RECEIVED, sid, bytes(body)))
        if flags & END_STREAM:
            self._end_remote(sid, s, events)
        elif s.unacked >= self.window >> 1:
            self._window_update(sid, s.unacked)
            s.unacked = 0

    def _end_remote(self, sid: int, s: _Stream, events: list[tuple]) -> None:
        s.remote_open = False
        if not s.local_open:
            del self.streams[sid]
        events.append((ENDED, sid))

    def _headers(self, sid: int, flags: int, payload: bytes | bytearray, events: list[tuple]) -> None:
        if not sid:
            raise ProtocolError(PROTOCOL_ERROR, "HEADERS on the connection")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(sid, bytes(block), bool(flags & END_STREAM), events)
        else:
            self._block, self._block_stream, self._block_end = bytearray(block), sid, bool(flags & END_STREAM)

    def _continuation(self, sid: int, flags: int, payload: bytes | bytearray, events: list[tuple]) -> None:
        if self._block is None or sid != self._block_stream:
            raise ProtocolError(PROTOCOL_ERROR, "CONTINUATION without the HEADERS it continues")
        self._block += payload
        if len(self._block) > MAX_HEADER_BLOCK:
            raise ProtocolError(ENHANCE_YOUR_CALM, "a header block over 1 MiB")
        if flags & END_HEADERS:
            block, self._block = bytes(self._block), None
            self._header_block(sid, block, self._block_end, events)

    def _header_block(self, sid: int, block: bytes, end: bool, events: list[tuple]) -> None:
        headers = self._decode(block)  # always: the peer's table may have moved, and what follows with it
        s = self.streams.get(sid)
        if s is not None:  # trailers: they must end the stream
            if not s.remote_open or not end:
                del self.streams[sid]
                code = STREAM_CLOSED if not s.remote_open else PROTOCOL_ERROR
                self._rst(sid, code)
                events.append((RESET, sid, code))
                return
            self._end_remote(sid, s, events)
            return
        if sid <= self.last_stream:  # closed: trailers in flight when our reset or our end crossed them
            return
        if not sid & 1:
            raise ProtocolError(PROTOCOL_ERROR, f"a client's stream must be odd, not {sid}")
        self.last_stream = sid
        if self.closed:  # after our GOAWAY: not taken (the peer retries it elsewhere)
            return
        s = self.streams[sid] = _Stream(self._peer_window)
        events.append((REQUEST, sid, headers))
        if end:
            self._end_remote(sid, s, events)

    def _decode(self, block: bytes) -> tuple[tuple[bytes, bytes], ...]:
        table = self._table
        kept = self._blocks.get(block)
        if kept is not None:
            headers, changes, version = kept
            if version is None:  # the block alone says its headers: the table changed as decoding it would have
                for name, value in changes:
                    if name is None:
                        _resize(table, value)
                    else:
                        HeaderTable.add(table, name, value)
                table.version += bool(changes)
                return headers
            if version == table.version:  # the entries it read are as they were
                return headers
        reads, version = table.reads, table.version
        table.changes = []
        headers = tuple((bytes(k), bytes(v)) for k, v in self._decoder.decode(block, raw=True))
        if table.reads == reads or table.version == version:  # kept for the next time it comes
            if len(self._blocks) >= KEPT_BLOCKS:
                self._blocks.clear()
            self._blocks[block] = (headers, tuple(table.changes), None if table.reads == reads else version)
        return headers

    def _window(self, sid: int, payload: bytes | bytearray, events: list[tuple]) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        n = _U32.unpack(payload)[0] & MAX_WINDOW
        if not sid:
            if not n:
                raise ProtocolError(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += n
            if self._send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "the connection's window past 2^31-1")
            events.append((WINDOW_OPENED, 0))
            return
        s = self.streams.get(sid)
        if s is None:
            if sid > self.last_stream:
                raise ProtocolError(PROTOCOL_ERROR, f"WINDOW_UPDATE on stream {sid}, never opened")
            return  # closed: one in flight
        s.window += n
        if not n or s.window > MAX_WINDOW:
            del self.streams[sid]
            code = FLOW_CONTROL_ERROR if n else PROTOCOL_ERROR
            self._rst(sid, code)
            events.append((RESET, sid, code))
            return
        events.append((WINDOW_OPENED, sid))

    def _reset(self, sid: int, payload: bytes | bytearray, events: list[tuple]) -> None:
        if not sid or len(payload) != 4:
            raise ProtocolError(PROTOCOL_ERROR if not sid else FRAME_SIZE_ERROR, "a malformed RST_STREAM")
        if sid > self.last_stream:
            raise ProtocolError(PROTOCOL_ERROR, f"RST_STREAM on stream {sid}, never opened")
        if self.streams.pop(sid, None) is not None:
            events.append((RESET, sid, _U32.unpack(payload)[0]))

    def _settings(self, sid: int, flags: int, payload: bytes | bytearray, events: list[tuple]) -> None:
        if sid:
            raise ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "a malformed SETTINGS")
        for at in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, at)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "an initial window past 2^31-1")
                delta, self._peer_window = value - self._peer_window, value
                for s in self.streams.values():
                    s.window += delta
                    if s.window > MAX_WINDOW:
                        raise ProtocolError(FLOW_CONTROL_ERROR, "a stream's window past 2^31-1")
                if delta > 0:
                    events.append((WINDOW_OPENED, 0))
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise ProtocolError(PROTOCOL_ERROR, f"a frame size of {value}")
                self.max_outbound_frame_size = value
            elif key == ENABLE_PUSH and value > 1:
                raise ProtocolError(PROTOCOL_ERROR, f"ENABLE_PUSH of {value}")
            # HEADER_TABLE_SIZE: what we send uses no dynamic table; the others ask nothing of a server
        self._out += frame_header(0, SETTINGS, ACK, 0)
