# SPDX-License-Identifier: MIT
"""A session with the daemon (Client), its pool (Pool) and its sequences (Sequence).

Who owns what: a Client owns its session, the pool's mapping and its sequences.  Arrays from
Pool.array() are views of the mapping, no copy, and keep the Client alive; Client.close()
refuses (BufferError) while one exists, as mmap does.  A Client garbage-collected without
close() disconnects, and the daemon closes every sequence it still had.

Threads: every call on a Client (and its sequences) takes the Client's lock, so two threads
may share one; their calls run one after the other, each a round trip to the daemon.  Writes
to the pool's memory take no lock: which thread writes which block is the engine's business.
"""
import ctypes
import threading
import weakref
from typing import Iterable, Optional, Sequence as Seq

import numpy as np

from kvpaged._native import ConnectOptions, PoolInfo, Table, lib, u32, u64
from kvpaged._native import Retention as Retention_c
from kvpaged.errors import error
from kvpaged.rings import COMPLETION_DTYPE, OP_DTYPE, Op, Rings

_DTYPES = {4: np.float32, 2: np.float16, 1: np.uint8}

#: A table entry a retention policy released (kvp.h's KVP_TABLE_HOLE): no block there.
HOLE = 0xFFFFFFFF
#: Client.open flag: at least the last token is left uncached, so its logits can be computed.
OPEN_RECOMPUTE_LAST = 1 << 0
#: first for Sequence.report_scores: the weights are for the packed slots, all of them.
PACKED = 0xFFFFFFFF


class Retention:
    """What a sequence keeps (docs/retention.md); Retention.sinks() or Retention.h2o().

    sinks: the first n_sink tokens and the last recent.  h2o: the first n_sink, the last
    recent and, up to budget tokens in all, the blocks (granularity "blocks") or tokens
    ("tokens") with the most attention reported (Sequence.report_scores), scores multiplied
    by decay at each report.
    """

    _POLICIES = {"full": 0, "sinks": 1, "h2o": 2}
    _GRANULARITY = {"blocks": 0, "tokens": 1}

    def __init__(self, policy: str = "full", n_sink: int = 0, recent: int = 0,
                 budget: int = 0, granularity: str = "blocks", decay: float = 0.0):
        if policy not in self._POLICIES or granularity not in self._GRANULARITY:
            raise ValueError("policy: full, sinks or h2o; granularity: blocks or tokens")
        self.policy, self.n_sink, self.recent, self.budget = policy, n_sink, recent, budget
        self.granularity, self.decay = granularity, decay

    @classmethod
    def sinks(cls, n_sink: int, recent: int) -> "Retention":
        return cls("sinks", n_sink=n_sink, recent=recent)

    @classmethod
    def h2o(cls, recent: int, budget: int, n_sink: int = 0, granularity: str = "blocks",
            decay: float = 0.0) -> "Retention":
        return cls("h2o", n_sink=n_sink, recent=recent, budget=budget,
                   granularity=granularity, decay=decay)

    def _c(self) -> Retention_c:
        return Retention_c(size=ctypes.sizeof(Retention_c), policy=self._POLICIES[self.policy],
                           n_sink=self.n_sink, recent=self.recent, budget=self.budget,
                           granularity=self._GRANULARITY[self.granularity], decay=self.decay)


def _array_of(t: Table) -> np.ndarray:
    if not t.len:
        return np.zeros(0, dtype=np.uint32)
    return np.ctypeslib.as_array(t.blocks, (t.len,)).copy()


def _tokens(tokens: Iterable[int]):
    a = np.ascontiguousarray(np.asarray(tokens, dtype=np.uint32).reshape(-1))
    return a, a.ctypes.data_as(ctypes.POINTER(u32)), len(a)


class Pool:
    """The pool's geometry and layout (kvp_pool_info), and its memory as arrays.

    The byte offset of (block b, layer l, kv k (0 K, 1 V), slot s, head h) is
    b*block_stride + l*layer_stride + k*kv_stride + s*slot_stride + h*head_stride, then
    head_dim elements of element_bytes each: array() has that as its shape and strides.
    """

    def __init__(self, client: "Client", info: PoolInfo):
        self._client = client
        self.name: str = info.name.decode()
        self.backend: str = info.backend.decode()
        for f in ("layers", "kv_heads", "head_dim", "element_bytes", "block_tokens",
                  "capacity_blocks", "max_seq_tokens", "vocab_size", "bytes_per_token",
                  "block_bytes", "pool_bytes", "block_stride", "layer_stride", "kv_stride",
                  "slot_stride", "head_stride", "window"):
            setattr(self, f, int(getattr(info, f)))

    @property
    def shape(self) -> tuple:
        """(capacity_blocks, layers, 2, block_tokens, kv_heads, head_dim)."""
        return (self.capacity_blocks, self.layers, 2, self.block_tokens, self.kv_heads,
                self.head_dim)

    @property
    def strides(self) -> tuple:
        """The byte strides of shape's dimensions (the last: element_bytes)."""
        return (self.block_stride, self.layer_stride, self.kv_stride, self.slot_stride,
                self.head_stride, self.element_bytes)

    def array(self, dtype=None) -> np.ndarray:
        """The mapped pool as a NumPy array of shape and strides above: no copy.

        dtype defaults to float32 for 4-byte elements, float16 for 2 (a bfloat16 pool: take
        np.uint16 and convert, or view the bits), uint8 for 1; another dtype must have the
        element's size.  Valid while the Client is open (the array keeps it alive).
        """
        dt = np.dtype(dtype if dtype is not None else _DTYPES.get(self.element_bytes))
        if dt.itemsize != self.element_bytes:
            raise ValueError("a %d-byte dtype for %d-byte elements" %
                             (dt.itemsize, self.element_bytes))
        return self._client._array(dt, self.shape, self.strides)

    def tensor(self, dtype=None):
        """array() as a torch.Tensor sharing the mapped memory (torch.from_numpy: no copy),
        when torch is importable (Debian's python3-torch); ImportError otherwise.

        dtype: a torch dtype of the element's size, default float32 for 4-byte elements and
        float16 for 2; torch.bfloat16 views a bfloat16 pool's bits as what they are.  The
        tensor keeps the Client alive, and Client.close() refuses while it exists.
        """
        import torch

        if dtype is None:
            dtype = {4: torch.float32, 2: torch.float16, 1: torch.uint8}.get(self.element_bytes)
        size = torch.tensor([], dtype=dtype).element_size()
        if size != self.element_bytes:
            raise ValueError("a %d-byte dtype for %d-byte elements" % (size,
                                                                       self.element_bytes))
        raw = {4: np.int32, 2: np.int16, 1: np.uint8}[size]
        return torch.from_numpy(self.array(raw)).view(dtype)


class Sequence:
    """One sequence of the daemon's: its id, the tokens cached at open, its block table.

    table is a NumPy uint32 array of block ids (a copy, updated by each call that changes
    it).  A context manager: it closes itself.
    """

    def __init__(self, client: "Client", seq: int, cached: int, table: Table):
        self._client = client
        self.id: int = seq
        self.cached: int = cached
        self._table = table
        self.closed = False
        self._stale = False  # a ring completion's table was truncated: fetch it

    @property
    def table(self) -> np.ndarray:
        """The block table, a copy: entry i holds tokens [i*block_tokens, (i+1)*block_tokens);
        HOLE where a retention policy released the block."""
        if self._stale:
            self.info()
        return _array_of(self._table)

    def report_scores(self, first: int, weights) -> None:
        """h2o: one decode step's attention to positions [first, first + len(weights)) (summed
        over heads and layers); first=PACKED: to the packed slots, in order, all of them."""
        w = np.ascontiguousarray(np.asarray(weights, dtype=np.float32).reshape(-1))
        self._client._call(lib.kvp_report_scores, self.id, first,
                           w.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), len(w))

    def packed(self) -> tuple:
        """h2o at token granularity: (the packed blocks, the original position each packed
        slot holds), two uint32 arrays; slot k is slot k % block_tokens of block
        blocks[k // block_tokens]."""
        b, pos = Table(), Table()
        try:
            self._client._call(lib.kvp_seq_packed, self.id, ctypes.byref(b), ctypes.byref(pos))
            return _array_of(b), _array_of(pos)
        finally:
            lib.kvp_table_free(ctypes.byref(b))
            lib.kvp_table_free(ctypes.byref(pos))

    def append(self, tokens: Iterable[int]) -> None:
        """Gives len(tokens) more tokens slots; the table grows to hold them."""
        a, p, n = _tokens(tokens)
        self._client._call(lib.kvp_append, self.id, p, n, ctypes.byref(self._table))

    def commit(self, ntokens: int) -> int:
        """Marks the first ntokens tokens written: full blocks become findable by others.
        Returns how many table entries were replaced by an equal block committed first."""
        return self._client._call(lib.kvp_commit, self.id, ntokens, ctypes.byref(self._table))

    def fork(self) -> "Sequence":
        """A new sequence sharing every block; a write into a shared block copies it first."""
        child, t = u64(), Table()
        self._client._call(lib.kvp_fork, self.id, ctypes.byref(child), ctypes.byref(t))
        return Sequence(self._client, child.value, 0, t)

    def park(self) -> None:
        """Parks it: its blocks may go under memory pressure; its tokens are kept."""
        self._client._call(lib.kvp_park, self.id)

    def resume(self) -> int:
        """Makes it active again: returns how many trailing tokens to compute again."""
        rec = u32()
        self._client._call(lib.kvp_resume, self.id, ctypes.byref(rec), ctypes.byref(self._table))
        return rec.value

    def info(self) -> tuple:
        """(tokens with a slot, tokens committed); the table is refreshed too."""
        n, c = u32(), u32()
        self._client._call(lib.kvp_seq_info, self.id, ctypes.byref(n), ctypes.byref(c),
                           ctypes.byref(self._table))
        self._stale = False
        return n.value, c.value

    def _closed_by_ring(self) -> None:
        if not self.closed:
            self.closed = True
            lib.kvp_table_free(ctypes.byref(self._table))

    def close(self) -> None:
        """Closes it in the daemon (idempotent)."""
        if not self.closed:
            self.closed = True
            try:
                if self._client._c:
                    self._client._call(lib.kvp_close, self.id)
            finally:
                lib.kvp_table_free(ctypes.byref(self._table))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Not closed: the daemon keeps it until the Client goes; only the table is freed here
        # (no call from a finalizer, which may run in a thread that holds the Client's lock).
        if not getattr(self, "closed", True):
            lib.kvp_table_free(ctypes.byref(self._table))


class Client:
    """A session with the daemon: kvp_connect(), until close() (kvp_disconnect())."""

    def __init__(self, socket: Optional[str] = None, pool: Optional[str] = None,
                 namespace: Optional[str] = None, name: str = "python", ring_entries: int = 0,
                 ring_data_bytes: int = 0, spin_us: int = 0):
        err = ctypes.create_string_buffer(512)
        if ring_entries and not ring_data_bytes:
            ring_data_bytes = 1 << 20
        o = ConnectOptions(size=ctypes.sizeof(ConnectOptions),
                           socket_path=socket.encode() if socket else None,
                           pool=pool.encode() if pool else None,
                           ns=namespace.encode() if namespace else None,
                           client_name=name.encode(), ring_entries=ring_entries,
                           ring_data_bytes=ring_data_bytes, spin_us=spin_us,
                           error_buf=ctypes.cast(err, ctypes.c_void_p), error_len=len(err))
        c = ctypes.c_void_p()
        self._c = None
        self._lock = threading.Lock()
        self._exports = []  # weak references to the buffers arrays were made over
        r = lib.kvp_connect(ctypes.byref(o), ctypes.byref(c))
        if r < 0:
            raise error(-r, err.value.decode(errors="replace"))
        self._c = c
        self.pool = Pool(self, lib.kvp_pool(c).contents)
        self._rings = Rings(self)

    @property
    def namespace(self) -> str:
        """The namespace the daemon assigned, e.g. "uid:1000/tenant-a"."""
        return lib.kvp_namespace(self._c).decode()

    def _call(self, fn, *args) -> int:
        with self._lock:
            if not self._c:
                raise ValueError("the client is closed")
            return self._check(fn(self._c, *args))

    def _array(self, dt, shape, strides) -> np.ndarray:
        with self._lock:
            if not self._c:
                raise ValueError("the client is closed")
            base = lib.kvp_pool_base(self._c)
            if not base:
                raise ValueError("the pool is not in this process's memory (a GPU pool)")
            buf = (ctypes.c_char * self.pool.pool_bytes).from_address(base)
            buf._kvpaged_client = self  # the mapping lives as long as the array
            self._exports = [w for w in self._exports if w() is not None]
            self._exports.append(weakref.ref(buf))
            return np.ndarray(shape, dtype=dt, buffer=buf, strides=strides)

    def open(self, tokens: Seq[int], extra_key: int = 0, flags: int = 0,
             retention: Optional[Retention] = None) -> Sequence:
        """Opens a sequence for a prompt: .cached leading tokens already have their K/V.
        retention: what it keeps (Retention.sinks(), Retention.h2o()); None: everything."""
        a, p, n = _tokens(tokens)
        seq, cached, t = u64(), u32(), Table()
        r = ctypes.byref(retention._c()) if retention is not None else None
        self._call(lib.kvp_open_retained, p, n, extra_key, flags, r, ctypes.byref(seq),
                   ctypes.byref(cached), ctypes.byref(t))
        return Sequence(self, seq.value, cached.value, t)

    def lookup(self, tokens: Seq[int], extra_key: int = 0, flags: int = 0) -> int:
        """How many leading tokens of a prompt are cached, opening nothing."""
        a, p, n = _tokens(tokens)
        cached = u32()
        self._call(lib.kvp_lookup, p, n, extra_key, flags, ctypes.byref(cached))
        return cached.value

    # ------------------------------------------------------------------------ rings

    def _check(self, r: int) -> int:
        """r, or the exception for -errno r with the library's reason (kvp_last_error)."""
        if r < 0:
            raise error(-r, lib.kvp_last_error(self._c).decode(errors="replace"))
        return r

    def _open_c(self):
        if not self._c:
            raise ValueError("the client is closed")
        return self._c

    def submit(self, ops: Iterable[Op]) -> int:
        """Queues operations (Op.append(), Op.commit(), ...) in one kvp_submit(): returns how
        many were queued, fewer when the ring or its data area is full (complete some, then
        submit the rest).  Needs a Client connected with ring_entries."""
        with self._lock:
            return self._rings.submit(self._open_c(), ops)

    def complete(self, min: int = 1, max: int = 64, timeout: Optional[float] = None) -> list:
        """Reaps up to max Completions, waiting for at least min (timeout in seconds, None:
        for ever; TimedOut when it runs out with none reaped)."""
        ms = -1 if timeout is None else int(timeout * 1000)
        with self._lock:
            return self._rings.complete(self._open_c(), min, max, ms)

    async def complete_async(self, min: int = 1, max: int = 64) -> list:
        """complete() for asyncio: waits on completion_fd() in the running loop, never
        blocking it.  Disconnected if the daemon closes the session."""
        return await self._rings.complete_async(min, max)

    def submit_raw(self, ops: np.ndarray, n: Optional[int] = None) -> int:
        """Queues the first n (default: all) entries of an OP_DTYPE array as they are (struct
        kvp_op); returns how many were queued.  The caller keeps the tokens and tables their
        addresses point to alive until complete_raw() has reaped them."""
        if ops.dtype != OP_DTYPE or not ops.flags.c_contiguous:
            raise ValueError("a C-contiguous array of kvpaged.OP_DTYPE")
        n = len(ops) if n is None else n
        if not 0 <= n <= len(ops):
            raise ValueError("n: 0 to len(ops)")
        with self._lock:
            if self._rings.inflight:
                raise ValueError("Op objects are in flight: complete() them first")
            r = self._check(lib.kvp_submit(self._open_c(), ops.ctypes.data, n))
            self._rings.raw_inflight += r
            return r

    def complete_raw(self, out: np.ndarray, min: int = 1,
                     timeout: Optional[float] = None) -> int:
        """Reaps into a COMPLETION_DTYPE array (struct kvp_completion) up to len(out)
        completions, waiting for at least min; returns how many."""
        if out.dtype != COMPLETION_DTYPE or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("a writable C-contiguous array of kvpaged.COMPLETION_DTYPE")
        ms = -1 if timeout is None else int(timeout * 1000)
        with self._lock:
            if self._rings.inflight or self._rings.carry:
                raise ValueError("Op objects are in flight: complete() them")
            r = self._check(lib.kvp_complete(self._open_c(), out.ctypes.data, len(out), min, ms))
            self._rings.raw_inflight -= r
            return r

    def completion_fd(self) -> int:
        """A descriptor that polls readable when completions may be waiting (after the
        binding armed it) or the daemon has closed the session: kvp_completion_fd().  The
        client's: do not close or read it."""
        if not hasattr(lib, "kvp_completion_fd"):
            raise NotImplementedError("libkvpaged before 0.3.0 has no completion fd")
        with self._lock:
            return self._check(lib.kvp_completion_fd(self._open_c()))

    def _arm(self) -> int:
        with self._lock:
            return self._check(lib.kvp_complete_arm(self._open_c()))

    def set_wait(self, ms: int) -> None:
        """How long open, append and resume wait for memory (0: fail at once, NoSpace)."""
        with self._lock:
            lib.kvp_set_wait(self._c, ms)

    def close(self) -> None:
        """Disconnects (the daemon closes the sequences left).  BufferError while an array
        of the pool exists; idempotent otherwise."""
        with self._lock:
            if not self._c:
                return
            if any(w() is not None for w in self._exports):
                raise BufferError("arrays of the pool still exist: delete them first")
            lib.kvp_disconnect(self._c)
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_c", None):
            lib.kvp_disconnect(self._c)
            self._c = None


def connect(socket: Optional[str] = None, pool: Optional[str] = None,
            namespace: Optional[str] = None, name: str = "python", ring_entries: int = 0,
            ring_data_bytes: int = 0, spin_us: int = 0) -> Client:
    """A Client: socket defaults to $KVPAGED_SOCKET, then the daemon's default; pool to the
    daemon's first; namespace narrows the one the daemon assigns.  ring_entries (a power of
    two; 0: none) asks for the shared-memory rings, with ring_data_bytes of data area
    (default 1 MiB) and complete() spinning spin_us before it sleeps."""
    return Client(socket=socket, pool=pool, namespace=namespace, name=name,
                  ring_entries=ring_entries, ring_data_bytes=ring_data_bytes, spin_us=spin_us)
