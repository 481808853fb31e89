# SPDX-License-Identifier: MIT
"""A pool's KV event stream (docs/events.md) as Python objects: vLLM's wire format, decoded.

    for batch in kvpaged.events.Subscriber("ipc:///run/kvpaged/events-main"):
        for ev in batch.events:          # Event(type, block_hashes, parent_block_hash, ...)
            ...

Needs python3-zmq and python3-msgpack (imported when a Subscriber is made).  A Subscriber is
one ZMQ SUB socket: use it from one thread.
"""
from dataclasses import dataclass, field
from typing import Iterator, List, Optional

_STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"]
_REMOVED = ["block_hashes", "medium"]
_FIELDS = {"BlockStored": _STORED, "BlockRemoved": _REMOVED, "AllBlocksCleared": []}


@dataclass
class Event:
    """BlockStored, BlockRemoved or AllBlocksCleared; the fields it does not have are None."""
    type: str
    block_hashes: List[int] = field(default_factory=list)
    parent_block_hash: Optional[int] = None
    token_ids: List[int] = field(default_factory=list)
    block_size: Optional[int] = None
    medium: Optional[str] = None


@dataclass
class Batch:
    """One message: its topic, seq (the epoch, the daemon's start, in seq >> 32), timestamp
    (seconds) and events; gap: seq did not follow the previous batch's within one epoch."""
    topic: bytes
    seq: int
    timestamp: float
    events: List[Event]
    gap: bool = False

    @property
    def epoch(self) -> int:
        return self.seq >> 32


def decode_event(ev) -> Event:
    """One event, either format (a map with "type", or a positional array)."""
    if isinstance(ev, dict):
        kind, fields = ev.get("type"), {k: v for k, v in ev.items() if k != "type"}
    elif isinstance(ev, (list, tuple)) and ev and isinstance(ev[0], str):
        kind = ev[0]
        fields = dict(zip(_FIELDS.get(kind, []), ev[1:]))
    else:
        raise ValueError("not an event: %r" % (ev,))
    if kind not in _FIELDS:
        raise ValueError("unknown event type %r" % (kind,))
    fields.pop("lora_id", None)
    return Event(type=kind, **fields)


class Subscriber:
    """Subscribes to endpoint (ipc:// or tcp://; curve=(server public, client public, client
    secret), Z85, for a tcp:// stream) and yields Batch objects as they come."""

    def __init__(self, endpoint: str, topic: bytes = b"", curve=None):
        import msgpack
        import zmq

        self._msgpack, self._zmq = msgpack, zmq
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        if curve:
            server, public, secret = (k.encode() if isinstance(k, str) else k for k in curve)
            self._sock.curve_serverkey, self._sock.curve_publickey = server, public
            self._sock.curve_secretkey = secret
        self._sock.setsockopt(zmq.SUBSCRIBE, topic)
        self._sock.connect(endpoint)
        self._last = None

    def receive(self, timeout_ms: Optional[int] = None) -> Optional[Batch]:
        """The next batch, or None after timeout_ms without one (None: wait)."""
        if timeout_ms is not None and not self._sock.poll(timeout_ms):
            return None
        topic, seq, payload = self._sock.recv_multipart()
        seq = int.from_bytes(seq, "big")
        ts, events, _rank = self._msgpack.unpackb(payload, raw=False, strict_map_key=False)
        gap = self._last is not None and seq >> 32 == self._last >> 32 and seq != self._last + 1
        self._last = seq
        return Batch(topic, seq, ts, [decode_event(e) for e in events], gap)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.receive()

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
