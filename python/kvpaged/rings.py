# SPDX-License-Identifier: MIT
"""The shared-memory rings (docs/client.md "Rings"): operations queued without a system call,
completions reaped the same way, in batches, and awaited in asyncio.

Two levels, on a Client connected with ring_entries:

- Op objects: Client.submit([Op.append(seq, [t]), Op.commit(seq, n), ...]) queues them in one
  kvp_submit() (one doorbell at most), and Client.complete() returns Completion objects.  A
  Sequence given to an Op has its block table kept up to date by the completion, as the
  socket calls do; OPEN and FORK completions carry the new Sequence.  The binding keeps every
  buffer alive until the operation completes.
- Arrays, for hot loops: Client.submit_raw(ops) takes a NumPy array of OP_DTYPE (struct
  kvp_op, field for field; tokens and table_out are addresses) and Client.complete_raw(out)
  fills one of COMPLETION_DTYPE.  The caller keeps the tokens and tables alive until their
  completions are reaped, and sees user_data as it set it.  On one Client, use one level or
  the other while operations are in flight.

Threads: submit and complete take the Client's lock; a blocking complete() holds it while it
waits, so let one thread drive a Client's rings (or use complete_async()).
"""
import asyncio
import ctypes
import errno
import os
from typing import Iterable, List, Optional

import numpy as np

from kvpaged import _native
from kvpaged._native import Table, lib, libc, u32

NOP, OPEN, APPEND, COMMIT, FORK, CLOSE, LOOKUP, SEQ_INFO, PARK, RESUME, SCORES, PACKED = range(12)
#: Completion.flags: the table did not fit table_cap (the Sequence's table is then fetched
#: over the socket the next time it is read).
TRUNCATED = 1

OP_DTYPE = np.dtype([("opcode", "<u4"), ("arg", "<u4"), ("user_data", "<u8"), ("seq", "<u8"),
                     ("extra_key", "<u8"), ("tokens", "<u8"), ("ntokens", "<u4"),
                     ("table_cap", "<u4"), ("table_out", "<u8")])
COMPLETION_DTYPE = np.dtype([("user_data", "<u8"), ("res", "<i4"), ("flags", "<u4"),
                             ("value", "<u8"), ("aux", "<u4"), ("table_len", "<u4")])
assert OP_DTYPE.itemsize == ctypes.sizeof(_native.Op)
assert COMPLETION_DTYPE.itemsize == ctypes.sizeof(_native.Completion)

_NAMES = ["NOP", "OPEN", "APPEND", "COMMIT", "FORK", "CLOSE", "LOOKUP", "SEQ_INFO", "PARK",
          "RESUME", "SCORES", "PACKED"]


_EMPTY = np.zeros(0, np.uint32)
_EMPTY.flags.writeable = False


def _u32(tokens) -> list:
    """Token ids as a list of ints (what submit() packs into the batch's one buffer)."""
    if isinstance(tokens, np.ndarray):
        return tokens.astype(np.uint32, copy=False).reshape(-1).tolist()
    return [int(t) & 0xFFFFFFFF for t in tokens]


def table_assign(t: Table, first: int, entries: np.ndarray) -> None:
    """Makes t entries [0, first) as they were, then entries (libkvpaged's own update)."""
    first = min(first, t.len)
    n = first + len(entries)
    if n == t.len and not len(entries):
        return
    if n > t.cap:
        cap = max(n + 16, 2 * t.cap)
        p = libc.realloc(ctypes.cast(t.blocks, ctypes.c_void_p), cap * 4)
        if not p:
            raise MemoryError("growing a block table")
        t.blocks = ctypes.cast(p, ctypes.POINTER(u32))
        t.cap = cap
    if len(entries):
        ctypes.memmove(ctypes.addressof(t.blocks.contents) + 4 * first, entries.ctypes.data,
                       4 * len(entries))
    t.len = n


class Op:
    """One operation for Client.submit(); made by the class methods below.

    seq is a Sequence (its table follows the completion) or a sequence id.  table_cap: the
    table entries room is made for (None: what the operation needs, as far as the binding
    knows).  user_data: anything; the Completion hands it back.
    """

    __slots__ = ("opcode", "seq", "arg", "extra_key", "tokens", "table_cap", "user_data",
                 "_queued")

    def __init__(self, opcode: int, seq=None, arg: int = 0, extra_key: int = 0, tokens=None,
                 table_cap: Optional[int] = 0, user_data=None):
        self.opcode, self.seq, self.arg, self.extra_key = opcode, seq, arg, extra_key
        self.tokens = _u32(tokens) if tokens is not None else None
        self.table_cap, self.user_data, self._queued = table_cap, user_data, False

    def __repr__(self) -> str:
        return "Op.%s(seq=%r)" % (_NAMES[self.opcode].lower(), _seq_id(self.seq))

    @classmethod
    def nop(cls, user_data=None) -> "Op":
        return cls(NOP, user_data=user_data)

    @classmethod
    def open(cls, tokens, extra_key: int = 0, flags: int = 0, table_cap=None,
             user_data=None) -> "Op":
        """Client.open over the rings; Completion.sequence is the new Sequence."""
        return cls(OPEN, arg=flags, extra_key=extra_key, tokens=tokens, table_cap=table_cap,
                   user_data=user_data)

    @classmethod
    def append(cls, seq, tokens, table_cap=None, user_data=None) -> "Op":
        return cls(APPEND, seq, tokens=tokens, table_cap=table_cap, user_data=user_data)

    @classmethod
    def commit(cls, seq, ntokens: int, table_cap=None, user_data=None) -> "Op":
        return cls(COMMIT, seq, arg=ntokens, table_cap=table_cap, user_data=user_data)

    @classmethod
    def fork(cls, seq, table_cap=None, user_data=None) -> "Op":
        """Sequence.fork over the rings; Completion.sequence is the child."""
        return cls(FORK, seq, table_cap=table_cap, user_data=user_data)

    @classmethod
    def close(cls, seq, user_data=None) -> "Op":
        return cls(CLOSE, seq, user_data=user_data)

    @classmethod
    def lookup(cls, tokens, extra_key: int = 0, flags: int = 0, user_data=None) -> "Op":
        """Completion.aux: how many leading tokens are cached."""
        return cls(LOOKUP, arg=flags, extra_key=extra_key, tokens=tokens, user_data=user_data)

    @classmethod
    def seq_info(cls, seq, table_cap=None, user_data=None) -> "Op":
        """Completion.value: tokens << 32 | committed."""
        return cls(SEQ_INFO, seq, table_cap=table_cap, user_data=user_data)

    @classmethod
    def park(cls, seq, user_data=None) -> "Op":
        return cls(PARK, seq, user_data=user_data)

    @classmethod
    def resume(cls, seq, table_cap=None, user_data=None) -> "Op":
        """Completion.aux: the trailing tokens to compute again."""
        return cls(RESUME, seq, table_cap=table_cap, user_data=user_data)

    @classmethod
    def scores(cls, seq, first: int, weights, user_data=None) -> "Op":
        """Sequence.report_scores over the rings."""
        w = np.ascontiguousarray(np.asarray(weights, dtype=np.float32).reshape(-1))
        return cls(SCORES, seq, arg=first, tokens=w.view(np.uint32), user_data=user_data)

    @classmethod
    def packed(cls, seq, table_cap: int, user_data=None) -> "Op":
        """Completion.table: the aux packed blocks, then the position each packed slot holds."""
        return cls(PACKED, seq, table_cap=table_cap, user_data=user_data)


def _seq_id(seq) -> int:
    if seq is None:
        return 0
    return seq if isinstance(seq, int) else seq.id


class Completion:
    """What one operation did: res (0 or -errno), error (the exception res stands for, or
    None), value, aux and table (as struct kvp_completion says, table a uint32 array), flags
    (TRUNCATED), the Op and its user_data; for OPEN and FORK, sequence (a Sequence)."""

    __slots__ = ("op", "user_data", "res", "flags", "value", "aux", "table", "error",
                 "sequence")

    def __repr__(self) -> str:
        return "Completion(%s, res=%d, value=%d, aux=%d)" % (self.op, self.res, self.value,
                                                              self.aux)

    @property
    def truncated(self) -> bool:
        return bool(self.flags & TRUNCATED)


def _default_cap(client, op: Op) -> int:
    """Table room for op: its whole table (OPEN: the prompt's blocks; a Sequence: its table's
    length and a block more), else the longest table the pool allows."""
    bt = client.pool.block_tokens
    if op.opcode == OPEN:
        return (len(op.tokens) + bt - 1) // bt + 1
    if op.opcode == APPEND:
        return (len(op.tokens) + bt - 1) // bt + 2
    if not isinstance(op.seq, int) and op.seq is not None:
        return op.seq._table.len + 2
    return (client.pool.max_seq_tokens or 65536) // bt + 2


def _needs_table(opcode: int) -> bool:
    return opcode in (OPEN, APPEND, COMMIT, FORK, SEQ_INFO, RESUME, PACKED)


class Rings:
    """The ring state of one Client (its _rings); the Client's methods call these under its
    lock."""

    def __init__(self, client):
        self.client = client
        self.inflight = {}
        self.next_id = 1
        self.raw_inflight = 0
        self.cbuf = None
        self.carry: List[Completion] = []  # reaped, not yet returned (an await cancelled)

    def submit(self, c, ops: Iterable[Op]) -> int:
        ops = list(ops)
        if not ops:
            return 0
        if self.raw_inflight:
            raise ValueError("raw operations are in flight: complete_raw() them first")
        if len(set(map(id, ops))) != len(ops) or any(op._queued for op in ops):
            raise ValueError("an Op is in flight already: make a new one")
        # The batch's tokens in one buffer and its tables in another: two allocations, and
        # the entries made in one conversion, whatever the batch's length.
        flat, caps, offs = [], [], []
        for op in ops:
            offs.append(len(flat))
            if op.tokens is not None:
                flat.extend(op.tokens)
            if _needs_table(op.opcode):
                caps.append(op.table_cap if op.table_cap is not None
                            else _default_cap(self.client, op))
            else:
                caps.append(0)
        toks = np.array(flat, dtype=np.uint32)
        out = np.empty(max(sum(caps), 1), dtype=np.uint32)
        tbase = toks.__array_interface__["data"][0]
        obase = out.__array_interface__["data"][0]
        first, entries, views, ooff = self.next_id, [], [], 0
        for i, op in enumerate(ops):
            nt = len(op.tokens) if op.tokens is not None else 0
            entries.append((op.opcode, op.arg, first + i, _seq_id(op.seq), op.extra_key,
                            tbase + 4 * offs[i] if nt else 0, nt, caps[i],
                            obase + 4 * ooff if caps[i] else 0))
            views.append(out[ooff:ooff + caps[i]] if caps[i] else None)
            ooff += caps[i]
        arr = np.array(entries, dtype=OP_DTYPE)
        r = self.client._check(lib.kvp_submit(c, arr.ctypes.data, len(ops)))
        self.next_id += len(ops)
        # Each queued op keeps its table's view (and so the buffer the library copies the
        # table into when it reaps the completion) until then.
        for i in range(r):
            ops[i]._queued = True
            self.inflight[first + i] = (ops[i], views[i])
        return r

    def complete(self, c, min_: int, max_: int, timeout_ms: int) -> List[Completion]:
        if self.raw_inflight:
            raise ValueError("raw operations are in flight: complete_raw() them")
        max_ = max(max_, 1)
        got, self.carry = self.carry[:max_], self.carry[max_:]
        if len(got) >= min_ and got:
            return got
        if self.cbuf is None or len(self.cbuf) < max_:
            self.cbuf = np.zeros(max(max_, 64), dtype=COMPLETION_DTYPE)
        want = max_ - len(got)
        r = lib.kvp_complete(c, self.cbuf.ctypes.data, want, max(min_ - len(got), 0),
                             timeout_ms)
        if r < 0 and got:
            return got  # reaped before the error: the caller's; a lasting one comes again
        self.client._check(r)
        reaped = [(self.inflight.pop(e[0]),) + tuple(e) for e in self.cbuf[:r].tolist()]
        for (op, view), *e in reaped:
            try:
                got.append(self._finish(op, view, *e))
            except Exception as ex:  # the rest of the batch is still handed back
                d = Completion()
                d.op, d.user_data, d.res, d.flags, d.value, d.aux = op, op.user_data, \
                    -errno.EIO, 0, 0, 0
                d.table, d.sequence, d.error = _EMPTY, None, ex
                got.append(d)
        return got

    def _finish(self, op: Op, view, user_data, res, flags, value, aux,
                table_len) -> Completion:
        op._queued = False
        d = Completion()
        d.op, d.user_data, d.res, d.flags = op, op.user_data, res, flags
        d.value, d.aux, d.sequence, d.error = value, aux, None, None
        d.table = view[:table_len] if view is not None else _EMPTY
        if res < 0:
            from kvpaged.errors import error

            d.error = error(-res, "%s: %s" % (_NAMES[op.opcode], os.strerror(-res)))
            return d
        opcode = op.opcode
        seq = op.seq if op.seq is not None and not isinstance(op.seq, int) else None
        if seq is not None and seq.closed:
            seq = None  # closed meanwhile (over the socket): nothing to keep current
        if opcode == OPEN or opcode == FORK:
            from kvpaged.client import Sequence

            t = Table()
            table_assign(t, 0, d.table)
            s = Sequence(self.client, value, aux if opcode == OPEN else 0, t)
            s._stale = d.truncated
            d.sequence = s
        elif seq is not None and opcode in (APPEND, COMMIT, SEQ_INFO, RESUME):
            if flags & TRUNCATED:
                seq._stale = True
            elif opcode == APPEND:
                if table_len:
                    table_assign(seq._table, aux, d.table)
            elif opcode != COMMIT or table_len or aux or value:
                table_assign(seq._table, 0, d.table)
                seq._stale = False
        elif seq is not None and opcode == CLOSE:
            seq._closed_by_ring()
        return d

    async def complete_async(self, min_: int, max_: int) -> List[Completion]:
        cl = self.client
        loop = asyncio.get_running_loop()
        fd = cl.completion_fd()
        max_ = max(max_, 1)
        min_ = min(min_, max_)
        got: List[Completion] = []
        try:
            while True:
                got += cl.complete(min=0, max=max_ - len(got), timeout=0)
                if len(got) >= min_:
                    done, got = got, []
                    return done
                if cl._arm() == 1:
                    continue
                ready = loop.create_future()

                def wake(f=ready):
                    if not f.done():
                        f.set_result(None)
                loop.add_reader(fd, wake)
                try:
                    await ready
                finally:
                    loop.remove_reader(fd)
        finally:
            # Cancelled, or the daemon went: what was reaped is returned by the next call.
            self.carry = got + self.carry
