# SPDX-License-Identifier: MIT
"""The rings from Python (Client.submit/complete, the raw arrays, asyncio) and pool.tensor(),
against the real daemon."""
import asyncio
import errno

import numpy as np
import pytest

import kvpaged
from kvpaged import Op

BT = 16


def prompt(n, base=1000):
    return [base + 7 * i for i in range(n)]


def test_ops_complete_in_order_and_keep_sequences_current(daemon):
    with kvpaged.connect(daemon.sock, ring_entries=64) as c:
        assert c.submit([Op.open(prompt(40), user_data="open")]) == 1
        (d,) = c.complete()
        assert (d.user_data, d.res, d.error, d.aux) == ("open", 0, None, 0)
        s = d.sequence
        assert len(s.table) == 3 and s.cached == 0
        # A batch: commit and fork in one submission; the fork shares every block.
        assert c.submit([Op.commit(s, 40, user_data=1), Op.fork(s, user_data=2)]) == 2
        done = c.complete(min=2)
        assert [x.user_data for x in done] == [1, 2] and all(x.res == 0 for x in done)
        child = done[1].sequence
        assert list(child.table) == list(s.table)
        # Appending to the child copies the shared partial block: its table follows.
        c.submit([Op.append(child, [5])])
        (d,) = c.complete()
        assert d.aux == 2 and len(d.table) == 1
        assert child.table[2] != s.table[2] and list(child.table[:2]) == list(s.table[:2])
        ct = list(child.table)
        assert child.info() == (41, 40) and list(child.table) == ct
        # The socket and the rings see the same sequences; lookups, info.
        c.submit([Op.lookup(prompt(40)), Op.seq_info(s)])
        look, info = c.complete(min=2)
        assert look.aux == 32 and info.value == (40 << 32 | 40)
        assert list(info.table) == list(s.table)
        # Errors come back as completions carrying the exception.
        c.submit([Op.close(999999, user_data="bad")])
        (d,) = c.complete()
        assert d.res == -errno.ENOENT and isinstance(d.error, kvpaged.NotFound)
        # A truncated table is fetched over the socket when next read.
        c.submit([Op.seq_info(s, table_cap=1)])
        (d,) = c.complete()
        assert d.truncated and len(d.table) == 1
        assert list(s.table) == list(info.table)
        # Close over the rings: the Sequence knows.
        c.submit([Op.close(child), Op.close(s)])
        assert [x.res for x in c.complete(min=2)] == [0, 0]
        assert child.closed and s.closed
        with pytest.raises(kvpaged.TimedOut):
            c.complete(timeout=0.05)


def test_a_batch_of_appends_and_park_resume(daemon):
    with kvpaged.connect(daemon.sock, ring_entries=64) as c:
        s = c.open(prompt(16))
        s.commit(16)
        toks = prompt(64, 5000)
        assert c.submit([Op.append(s, [t], user_data=i) for i, t in enumerate(toks)]) == 64
        done = c.complete(min=64, max=64)
        assert [d.user_data for d in done] == list(range(64)) and all(d.res == 0 for d in done)
        table = list(s.table)
        assert len(table) == 5 and s.info() == (80, 16) and list(s.table) == table
        c.submit([Op.commit(s, 80), Op.park(s)])
        assert [d.res for d in c.complete(min=2)] == [0, 0]
        c.submit([Op.resume(s)])
        (d,) = c.complete()
        assert d.res == 0 and d.aux <= 1 and list(s.table) == table
        s.close()


def test_raw_arrays_are_struct_kvp_op(daemon):
    with kvpaged.connect(daemon.sock, ring_entries=128) as c:
        s = c.open(prompt(1))
        toks = np.arange(64, dtype=np.uint32) + 7
        ops = np.zeros(64, dtype=kvpaged.OP_DTYPE)
        ops["opcode"] = 2  # APPEND
        ops["seq"] = s.id
        ops["tokens"] = toks.ctypes.data + 4 * np.arange(64)
        ops["ntokens"] = 1
        ops["user_data"] = np.arange(64) + 100
        out = np.zeros(64, dtype=kvpaged.COMPLETION_DTYPE)
        assert c.submit_raw(ops) == 64
        with pytest.raises(ValueError):
            c.submit([Op.nop()])
        got = 0
        while got < 64:
            got += c.complete_raw(out[got:], min=1)
        assert list(out["user_data"]) == list(range(100, 164))
        assert (out["res"] == 0).all()
        assert s.info()[0] == 65
        with pytest.raises(ValueError):
            c.submit_raw(np.zeros(4, dtype=np.uint64))
        s.close()


def test_asyncio_waits_on_the_completion_fd(daemon):
    async def main(c, s):
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1
        t = asyncio.create_task(ticker())
        # Nothing in flight: the wait does not block the loop.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.complete_async(), 0.2)
        assert ticks >= 5
        c.submit([Op.nop(user_data="n"), Op.append(s, [9], user_data="a")])
        done = await asyncio.wait_for(c.complete_async(min=2), 5)
        assert [d.user_data for d in done] == ["n", "a"]
        t.cancel()

    with kvpaged.connect(daemon.sock, ring_entries=16) as c:
        s = c.open(prompt(3))
        fd = c.completion_fd()
        assert fd >= 0 and c.completion_fd() == fd
        asyncio.run(main(c, s))
        assert s.info()[0] == 4
        s.close()
        # The daemon goes away while the loop waits: Disconnected, not a hang.
        daemon.proc.terminate()

        async def gone():
            with pytest.raises(kvpaged.Disconnected):
                await asyncio.wait_for(c.complete_async(), 10)
        asyncio.run(gone())
        daemon.proc.wait(10)


def test_misuse_is_refused_and_loses_nothing(daemon):
    with kvpaged.connect(daemon.sock, ring_entries=16) as c:
        s = c.open(prompt(3))
        op = Op.append(s, [4])
        with pytest.raises(ValueError):
            c.submit([op, op])
        assert c.submit([op]) == 1
        with pytest.raises(ValueError):
            c.submit([op])  # in flight: its table buffer is still the library's to fill
        ops = np.zeros(2, dtype=kvpaged.OP_DTYPE)
        with pytest.raises(ValueError):
            c.submit_raw(ops)  # objects in flight
        with pytest.raises(ValueError):
            c.complete_raw(np.zeros(2, dtype=kvpaged.COMPLETION_DTYPE))
        (d,) = c.complete()
        assert d.res == 0 and s.info()[0] == 4
        with pytest.raises(ValueError):
            c.submit_raw(ops, 3)
        with pytest.raises(ValueError):
            c.submit_raw(ops, -1)
        assert c.submit_raw(ops) == 2  # two NOPs
        with pytest.raises(ValueError):
            c.complete()
        out = np.zeros(2, dtype=kvpaged.COMPLETION_DTYPE)
        assert c.complete_raw(out, min=2) == 2
        # min above max: as many as max, never a loop that does not yield.
        c.submit([Op.nop(), Op.nop()])
        done = asyncio.run(asyncio.wait_for(c.complete_async(min=5, max=2), 5))
        assert len(done) == 2
        s.close()


def test_without_rings(daemon):
    with kvpaged.connect(daemon.sock) as c:
        for call in (lambda: c.submit([Op.nop()]), lambda: c.complete(timeout=0),
                     c.completion_fd):
            with pytest.raises(kvpaged.Error) as e:
                call()
            assert e.value.errno == errno.ENOTSUP


def test_tensor_aliases_the_pool(daemon):
    torch = pytest.importorskip("torch")
    with kvpaged.connect(daemon.sock) as a, kvpaged.connect(daemon.sock) as b:
        t = a.pool.tensor()
        assert t.dtype == torch.float32 and tuple(t.shape) == a.pool.shape
        assert t.stride() == tuple(x // 4 for x in a.pool.strides)
        t[2, 1, 0, 3, 1] = torch.tensor([1.0, 2.0, 3.0, 4.0])
        y = b.pool.array()
        assert list(y[2, 1, 0, 3, 1]) == [1.0, 2.0, 3.0, 4.0]
        y[2, 1, 0, 4, 0] = [5, 6, 7, 8]
        assert t[2, 1, 0, 4, 0].tolist() == [5, 6, 7, 8]
        x = a.pool.array()
        assert x.ctypes.data == t.data_ptr()
        # A bfloat16 view of the same bits; a dtype of the wrong size is refused.
        h = a.pool.tensor(torch.int32)
        assert h[2, 1, 0, 3, 1, 0].item() == np.float32(1.0).view(np.int32)
        with pytest.raises(ValueError):
            a.pool.tensor(torch.bfloat16)
        with pytest.raises(BufferError):
            a.close()
        del t, x, h, y
        import gc
        gc.collect()


def test_tensor_bfloat16(tmp_path):
    torch = pytest.importorskip("torch")
    from conftest import start, stop
    d = start(tmp_path, "layers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 2\n"
              "block_tokens = 16\ncapacity_blocks = 4\n")
    try:
        with kvpaged.connect(d.sock) as c:
            t = c.pool.tensor(torch.bfloat16)
            assert t.dtype == torch.bfloat16 and tuple(t.shape) == c.pool.shape
            t[1, 0, 1, 2, 0] = torch.tensor([1.5, -2.0, 3.0, 0.25], dtype=torch.bfloat16)
            bits = c.pool.array(np.uint16)[1, 0, 1, 2, 0]
            # bfloat16 is a float32's upper half.
            f = (bits.astype(np.uint32) << 16).view(np.float32)
            assert f.tolist() == [1.5, -2.0, 3.0, 0.25]
            assert c.pool.tensor().dtype == torch.float16
            del t, bits
    finally:
        stop(d)
