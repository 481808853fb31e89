# SPDX-License-Identifier: MIT
"""kvpaged: the client library for Python engines (over libkvpaged.so.1, through ctypes).

    import kvpaged
    with kvpaged.connect() as c:
        kv = c.pool.array()            # [block, layer, kv, slot, head, dim], the pool itself
        with c.open(prompt) as s:      # s.cached tokens are cached, s.table their blocks
            ...                        # write K/V of the rest into kv[s.table[...]]
            s.commit(len(prompt))

The rings: kvpaged.connect(ring_entries=64), then client.submit([kvpaged.Op.append(s, [t]),
...]) and client.complete() (or await client.complete_async()); the raw arrays
(submit_raw/complete_raw over OP_DTYPE) for hot loops.  pool.tensor() is the pool as a
torch.Tensor.  docs/python.md has the whole API and an engine loop; python/examples/llama.py
is a real engine on it.
"""
from kvpaged import events
from kvpaged.admin import Admin
from kvpaged.client import (HOLE, OPEN_RECOMPUTE_LAST, PACKED, Client, Pool, Retention,
                            Sequence, connect)
from kvpaged.rings import COMPLETION_DTYPE, OP_DTYPE, TRUNCATED, Completion, Op
from kvpaged.errors import (AccessDenied, Busy, Disconnected, Error, InvalidArgument, NoSpace,
                            NotFound, ProtocolError, QuotaExceeded, TimedOut, TooBig,
                            TooManySessions)

__all__ = ["connect", "Admin", "events", "Client", "Pool", "Sequence", "Retention", "HOLE",
           "PACKED", "OPEN_RECOMPUTE_LAST", "Op", "Completion", "OP_DTYPE", "COMPLETION_DTYPE",
           "TRUNCATED", "Error", "NotFound", "AccessDenied", "NoSpace",
           "QuotaExceeded", "Busy", "InvalidArgument", "TooManySessions", "TooBig",
           "Disconnected", "ProtocolError", "TimedOut"]
