# SPDX-License-Identifier: MIT
"""The real daemon for the binding's tests: $KVPAGED_BIN, a fresh one per test, in tmp_path."""
import os
import subprocess
import time
from types import SimpleNamespace

import pytest


def start(tmp_path, pool_conf: str):
    """A daemon with one pool ([pool main] + pool_conf), its sockets in tmp_path."""
    conf = tmp_path / "kvpaged.conf"
    conf.write_text("[daemon]\nsocket = %s/kvpaged.sock\nadmin_socket = %s/admin.sock\n"
                    "[pool main]\n%s" % (tmp_path, tmp_path, pool_conf))
    log = open(tmp_path / "kvpaged.log", "w")
    p = subprocess.Popen([os.environ["KVPAGED_BIN"], "--config", str(conf)], stderr=log)
    for _ in range(500):
        if "(admin)" in (tmp_path / "kvpaged.log").read_text() or p.poll() is not None:
            break
        time.sleep(0.01)
    if p.poll() is not None:
        raise RuntimeError("kvpaged did not start: " + (tmp_path / "kvpaged.log").read_text())
    return SimpleNamespace(proc=p, sock=str(tmp_path / "kvpaged.sock"),
                           admin=str(tmp_path / "admin.sock"), log=log,
                           logfile=tmp_path / "kvpaged.log")


def stop(d):
    d.proc.terminate()
    assert d.proc.wait(10) == 0, d.logfile.read_text()
    d.log.close()


GEOMETRY = ("layers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\nblock_tokens = 16\n"
            "namespace = shared\n")


@pytest.fixture
def daemon(tmp_path):
    d = start(tmp_path, GEOMETRY + "capacity_blocks = 64\n")
    yield d
    stop(d)


@pytest.fixture
def small(tmp_path):
    """A pool of 4 blocks: memory runs out."""
    d = start(tmp_path, GEOMETRY + "capacity_blocks = 4\n")
    yield d
    stop(d)
