# SPDX-License-Identifier: MIT
"""kvpaged's Python binding against the real daemon (conftest.py starts one per test)."""
import gc
import threading

import numpy as np
import pytest

import kvpaged

BT = 16


def prompt(n, base=1000):
    return [base + 7 * i for i in range(n)]


def test_pool_geometry_and_namespace(daemon):
    with kvpaged.connect(daemon.sock) as c:
        p = c.pool
        assert (p.name, p.backend) == ("main", "host")
        assert (p.layers, p.kv_heads, p.head_dim, p.element_bytes, p.block_tokens,
                p.capacity_blocks) == (2, 2, 4, 4, BT, 64)
        assert p.shape == (64, 2, 2, BT, 2, 4)
        assert p.strides[0] == p.block_stride and p.strides[-1] == 4
        assert p.pool_bytes >= 64 * p.block_bytes
        assert c.namespace == "shared"
    with kvpaged.connect(daemon.sock, namespace="tenant-a") as c:
        assert c.namespace == "shared/tenant-a"


def test_array_aliases_the_pool_across_clients(daemon):
    with kvpaged.connect(daemon.sock) as a, kvpaged.connect(daemon.sock) as b:
        x, y = a.pool.array(), b.pool.array()
        assert x.dtype == np.float32 and x.shape == a.pool.shape
        assert x.ctypes.data != 0 and not x.flags.owndata
        x[3, 1, 1, 5, 1, :] = [1.5, 2.5, 3.5, 4.5]
        assert list(y[3, 1, 1, 5, 1]) == [1.5, 2.5, 3.5, 4.5]
        # The layout: the same element at the byte offset the strides give.
        p = a.pool
        off = 3 * p.block_stride + p.layer_stride + p.kv_stride + 5 * p.slot_stride + \
            p.head_stride
        flat = np.ndarray((p.pool_bytes,), np.uint8, buffer=y.base)
        assert flat[off:off + 16].view(np.float32).tolist() == [1.5, 2.5, 3.5, 4.5]
        with pytest.raises(ValueError):
            a.pool.array(np.float16)
        del x, y, flat


def test_close_refuses_while_an_array_lives(daemon):
    c = kvpaged.connect(daemon.sock)
    x = c.pool.array()
    v = x[1:3]
    del x
    with pytest.raises(BufferError):
        c.close()
    del v
    gc.collect()
    c.close()
    c.close()  # idempotent
    with pytest.raises(ValueError):
        c.lookup(prompt(BT))


def test_sequences_open_commit_hit_fork_park_resume(daemon):
    t = prompt(3 * BT + 5)
    with kvpaged.connect(daemon.sock) as a, kvpaged.connect(daemon.sock) as b:
        with a.open(t) as s:
            assert s.cached == 0 and len(s.table) == 4
            kv = a.pool.array()
            for i, blk in enumerate(s.table):
                kv[blk] = i + 1
            assert s.commit(len(t)) == 0
            assert s.info() == (len(t), len(t))
            first = s.table.copy()
        # Another process's session finds the three full blocks, with their K/V.
        assert b.lookup(t) == 3 * BT
        with b.open(t) as s2:
            assert s2.cached == 3 * BT
            assert list(s2.table[:3]) == list(first[:3])
            kv2 = b.pool.array()
            assert (kv2[s2.table[1]] == 2).all()
            s2.append(prompt(BT, 9000))
            assert len(s2.table) == 5
            with s2.fork() as child:
                assert list(child.table) == list(s2.table)
            s2.park()
            with pytest.raises(kvpaged.Busy):
                s2.append([1])
            assert s2.resume() == 0
            assert s2.info()[0] == len(t) + BT
        del kv, kv2


def test_errors_map_to_exceptions(tmp_path, small):
    with pytest.raises(kvpaged.NotFound) as e:
        kvpaged.connect(str(tmp_path / "nothing.sock"))
    assert e.value.errno == 2 and isinstance(e.value, OSError)
    with kvpaged.connect(small.sock) as c, kvpaged.connect(small.sock) as other:
        with pytest.raises(kvpaged.QuotaExceeded) as e:
            c.open(prompt(8 * BT))  # more than the session may hold (the pool's 4 blocks)
        assert e.value.errno == 122 and "max_blocks" in e.value.strerror
        with other.open(prompt(4 * BT, 7000)):
            with pytest.raises(kvpaged.NoSpace) as e:
                c.open(prompt(BT))
        assert e.value.errno == 28 and e.value.strerror
        with pytest.raises(kvpaged.InvalidArgument):
            c.open([])
        s = c.open(prompt(BT))
        s.close()
        with pytest.raises(kvpaged.NotFound):
            c._call(kvpaged.client.lib.kvp_close, s.id)


def test_a_client_collected_without_close_releases_its_sequences(small):
    c = kvpaged.connect(small.sock)
    c.open(prompt(4 * BT))  # every block of the pool
    with kvpaged.connect(small.sock) as other:
        with pytest.raises(kvpaged.NoSpace):
            other.open(prompt(BT, 5000))
        del c
        gc.collect()
        for _ in range(100):  # the daemon closes the session's sequences as it sees it go
            try:
                other.open(prompt(BT, 5000)).close()
                break
            except kvpaged.NoSpace:
                threading.Event().wait(0.02)
        else:
            pytest.fail("the collected client's blocks were never released")


def test_two_threads_share_a_client(daemon):
    errors = []
    with kvpaged.connect(daemon.sock) as c:
        def work(base):
            try:
                for i in range(15):  # 60 blocks in all: the pool's 64 keep every one
                    with c.open(prompt(2 * BT, base + 100 * i)) as s:
                        s.commit(2 * BT)
            except Exception as ex:  # noqa: BLE001 -- reported below
                errors.append(ex)
        th = [threading.Thread(target=work, args=(b,)) for b in (10000, 20000)]
        for x in th:
            x.start()
        for x in th:
            x.join()
        assert not errors
        for base in (10000, 20000):
            for i in range(15):
                assert c.lookup(prompt(2 * BT, base + 100 * i)) == 2 * BT


def test_retention_h2o_blocks_scores_and_errors(daemon):
    """Block 1 gets the attention: with budget 32 (the last 16 always kept) blocks 0 and 2 go."""
    with kvpaged.connect(daemon.sock) as c:
        keep = kvpaged.Retention.h2o(recent=16, budget=32)
        with c.open(prompt(64, 1), retention=keep) as s:
            for b in range(4):
                s.report_scores(b * 16, [1.0 if b == 1 else 0.01] * 16)
            s.commit(64)
            s.info()
            t = s.table
            assert [i for i, blk in enumerate(t) if blk == kvpaged.HOLE] == [0, 2]
            with pytest.raises(kvpaged.InvalidArgument) as e:
                s.report_scores(0, [1.0] * 4)  # a block it no longer holds
            assert "does not hold" in e.value.strerror
        with pytest.raises(kvpaged.InvalidArgument) as e:
            c.open(prompt(64, 1), retention=kvpaged.Retention.h2o(recent=16, budget=8))
        assert "budget below recent" in e.value.strerror
        with pytest.raises(ValueError):
            kvpaged.Retention("lru")


def test_retention_sinks_keep_a_bounded_table(daemon):
    with kvpaged.connect(daemon.sock) as c:
        with c.open([1], retention=kvpaged.Retention.sinks(n_sink=4, recent=16)) as s:
            for i in range(2, 200):
                s.append([i])
                s.commit(i)
            held = [blk for blk in s.table if blk != kvpaged.HOLE]
            assert 0 < len(held) <= 1 + 1 + 1  # ceil(4/16) + ceil(16/16) + 1 (docs/retention.md)
            assert len(s.table) == (199 + BT - 1) // BT  # holes keep every position's entry


def test_retention_h2o_tokens_packed_map(daemon):
    """Every 7th position of 0..47 gets the attention, the last 16 are kept: the 16 survivors
    of 0..47 are packed, and each packed slot holds its position's K/V."""
    with kvpaged.connect(daemon.sock) as c:
        kv = c.pool.array()
        keep = kvpaged.Retention.h2o(recent=16, budget=32, granularity="tokens")
        with c.open(prompt(64, 1), retention=keep) as s:
            t = s.table
            for q in range(64):
                kv[t[q // BT], :, :, q % BT] = q
            for b in range(4):
                s.report_scores(b * 16, [1.0 if b * 16 + i >= 48 else
                                         10.0 if (b * 16 + i) % 7 == 0 else 0.01
                                         for i in range(16)])
            s.commit(64)
            blocks, pos = s.packed()
            assert len(blocks) == 1 and len(pos) == 16
            want = set(range(0, 48, 7)) | (set(range(38, 48)) - {42})
            assert set(pos.tolist()) == want
            for k, q in enumerate(pos):
                assert (kv[blocks[k // BT], :, :, k % BT] == q).all()
        del kv


def test_admin_returns_kvpagedctls_json(daemon):
    admin = kvpaged.Admin(daemon.admin)
    with kvpaged.connect(daemon.sock, name="py-admin-test") as c:
        with c.open(prompt(2 * BT)) as s:
            s.commit(2 * BT)
            st = admin.status()
            assert st["sessions"] >= 1 and st["version"]
            assert [p["name"] for p in admin.pools()] == ["main"]
            assert "py-admin-test" in str(admin.sessions())
            assert len(admin.sequences()) == 1
    assert admin.verify()["ok"] is True
    assert admin.stats()["pools"][0]["pool"] == "main"
    assert admin.drop_cache()["freed_blocks"] == 2
    assert "kvpaged_" in admin.metrics()
    with pytest.raises(kvpaged.NotFound) as e:
        kvpaged.Admin(daemon.admin + ".nothing").status()
    assert "cannot connect" in e.value.strerror


def test_events_subscriber_decodes_the_stream(tmp_path):
    from conftest import GEOMETRY, start, stop

    ep = "ipc://%s/events" % tmp_path
    d = start(tmp_path, GEOMETRY + "capacity_blocks = 8\nevents_endpoint = %s\n"
              "events_namespaces = shared\nevents_topic = kv@py@test\nevents_batch_ms = 5\n"
              % ep)
    try:
        with kvpaged.events.Subscriber(ep) as sub, kvpaged.connect(d.sock) as c:
            threading.Event().wait(0.3)  # a SUB's subscription reaches the PUB after its connect
            t = prompt(2 * BT + 3)
            with c.open(t) as s:
                s.commit(len(t))
            stored = []
            while not stored:
                b = sub.receive(5000)
                assert b is not None, "no batch in 5 s"
                assert b.topic == b"kv@py@test" and not b.gap
                stored = [e for e in b.events if e.type == "BlockStored"]
            (e,) = stored
            assert len(e.block_hashes) == 2 and e.parent_block_hash is None
            assert e.token_ids == t[:2 * BT] and e.block_size == BT and e.medium == "CPU"
    finally:
        stop(d)
    assert kvpaged.events.decode_event(["BlockRemoved", [5], "GPU"]).block_hashes == [5]
    with pytest.raises(ValueError):
        kvpaged.events.decode_event({"type": "BlockEaten"})
