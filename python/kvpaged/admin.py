# SPDX-License-Identifier: MIT
"""The daemon's admin socket: what `kvpagedctl --json` prints, as dicts.

Admin runs kvpagedctl (the kvpaged package's; $KVPAGEDCTL or the one on PATH) for each call,
so its answers are exactly the tool's JSON, and a new field there is one here.  Each call is
one connection to the admin socket; an Admin holds nothing open and is thread-safe.
"""
import errno as _errno
import json
import os
import subprocess
from typing import Optional

from kvpaged.errors import error


class Admin:
    """Admin(socket=None): socket defaults to $KVPAGED_ADMIN_SOCKET, then /run/kvpaged/admin.sock
    (as kvpagedctl's); ctl is the kvpagedctl to run."""

    def __init__(self, socket: Optional[str] = None, ctl: Optional[str] = None):
        self.socket = socket
        self.ctl = ctl or os.environ.get("KVPAGEDCTL") or "kvpagedctl"

    def _run(self, command: str, pool: Optional[str] = None, json_out: bool = True):
        argv = [self.ctl]
        if self.socket:
            argv += ["--socket", self.socket]
        if pool:
            argv += ["--pool", pool]
        if json_out:
            argv.append("--json")
        argv.append(command)
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except FileNotFoundError as e:
            raise error(_errno.ENOENT, "%s: %s" % (self.ctl, e.strerror)) from None
        if p.returncode != 0 and not (command == "verify" and p.stdout.strip()):
            why = (p.stderr or p.stdout).strip() or "%s %s failed" % (self.ctl, command)
            raise error(_errno.ENOENT if "No such file" in why else
                        _errno.EACCES if "ermission denied" in why else _errno.EIO, why)
        return json.loads(p.stdout) if json_out else p.stdout

    def status(self) -> dict:
        """Version, uptime, sessions, requests."""
        return self._run("status")

    def pools(self) -> list:
        """Each pool's geometry and block usage, a dict per pool."""
        return self._run("pools")

    def sessions(self) -> list:
        """The connected clients, a dict each."""
        return self._run("sessions")

    def sequences(self) -> list:
        """The open sequences, a dict each."""
        return self._run("sequences")

    def stats(self, pool: Optional[str] = None) -> dict:
        """Hit rates and counters, per pool and per namespace (one pool's with pool)."""
        return self._run("stats", pool)

    def verify(self) -> dict:
        """The full invariant check: its report (ok false when anything is wrong)."""
        return self._run("verify")

    def drop_cache(self, pool: Optional[str] = None) -> dict:
        """Frees every cached block (of one pool with pool)."""
        return self._run("drop-cache", pool)

    def metrics(self) -> str:
        """The Prometheus text exposition."""
        return self._run("metrics", json_out=False)
