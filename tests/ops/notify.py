# Shared by tests/ops/notify.test and drain.test: a NOTIFY_SOCKET listener that records every
# message systemd would get, and kvpaged with its clients run with timeouts in a temporary
# directory.  Everything started is stopped on exit; a failing test prints the daemon's log.
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KVPAGED = os.environ.get("KVPAGED_BIN", "./kvpaged")
KVPAGEDCTL = os.environ.get("KVPAGEDCTL_BIN", "./kvpagedctl")
OPS_CLIENT = os.environ.get("OPS_CLIENT", "./tests/ops/ops-client")

_procs = []
_tmp = tempfile.mkdtemp(prefix="kvpaged-ops-")
_log_path = os.path.join(_tmp, "kvpaged.log")


def _cleanup():
    for p in _procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(_tmp, ignore_errors=True)


atexit.register(_cleanup)


def fail(why):
    sys.stderr.write("FAIL: %s\n" % why)
    try:
        with open(_log_path) as f:
            lines = f.readlines()
        sys.stderr.write("--- kvpaged log ---\n" + "".join(lines[-40:]))
    except OSError:
        pass
    sys.exit(1)


def check(cond, why):
    if not cond:
        fail(why)


def tmp(name):
    return os.path.join(_tmp, name)


class Notify:
    """Binds a datagram socket and records (time, {key: value}) for every message."""

    def __init__(self, on_message=None):
        self.on_message = on_message  # called in the listener thread as each message arrives
        self.path = tmp("notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(self.path)
        self.messages = []
        self.cv = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            data = self.sock.recv(65536)
            now = time.monotonic()
            fields = {}
            for line in data.decode().split("\n"):
                if "=" in line:
                    k, v = line.split("=", 1)
                    fields[k] = v
            if self.on_message:
                self.on_message(fields)
            with self.cv:
                self.messages.append((now, fields))
                self.cv.notify_all()

    def wait(self, pred, timeout, start=0, what="a notify message"):
        """The index of the first message from start on that satisfies pred."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for i in range(start, len(self.messages)):
                    if pred(self.messages[i][1]):
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    fail("no %s within %.1f s; got %r" % (what, timeout, self.snapshot()[start:]))
                self.cv.wait(left)

    def snapshot(self):
        with self.cv:
            return list(self.messages)

    def count(self):
        with self.cv:
            return len(self.messages)


POOL = """[pool {name}]
layers = 2
kv_heads = 2
head_dim = 8
element_bytes = 2
block_tokens = 16
capacity_blocks = {capacity}
{extra}
"""


def config(daemon="", limits="", pools=(("main", 256, ""),)):
    """A configuration with sockets in the temporary directory."""
    text = "[daemon]\nsocket = %s\nadmin_socket = %s\n%s\n" % (tmp("kvpaged.sock"),
                                                              tmp("admin.sock"), daemon)
    if limits:
        text += "[limits]\n%s\n" % limits
    for name, capacity, extra in pools:
        text += POOL.format(name=name, capacity=capacity, extra=extra)
    return text


class Daemon:
    def __init__(self, conf, notify=None, watchdog_usec=None, args=()):
        self.conf = tmp("kvpaged.conf")
        self.write(conf)
        env = dict(os.environ)
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                  "LISTEN_FDNAMES"):
            env.pop(k, None)
        if notify:
            env["NOTIFY_SOCKET"] = notify.path
        if watchdog_usec:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        self.log = open(_log_path, "a")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([KVPAGED, "--config", self.conf, "--verbose"] + list(args),
                                     stderr=self.log, env=env)
        _procs.append(self.proc)
        self.socket = tmp("kvpaged.sock")
        self.admin = tmp("admin.sock")

    def write(self, conf):
        with open(self.conf + ".new", "w") as f:
            f.write(conf)
        os.rename(self.conf + ".new", self.conf)

    def wait_ready(self, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ctl("status", check_rc=False).returncode == 0:
                return
            check(self.proc.poll() is None, "kvpaged exited at start (%s)" % self.proc.returncode)
            time.sleep(0.01)
        fail("kvpaged did not answer within %d s" % timeout)

    def ctl(self, *args, check_rc=True):
        r = subprocess.run([KVPAGEDCTL, "--socket", self.admin] + list(args),
                           capture_output=True, text=True, timeout=10)
        if check_rc:
            check(r.returncode == 0, "kvpagedctl %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            fail("kvpaged still runs %.1f s after the signal" % timeout)

    def log_text(self):
        with open(_log_path) as f:
            return f.read()


class Client:
    """ops-client in the background; lines of its stdout can be awaited."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([OPS_CLIENT] + [str(a) for a in args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        _procs.append(self.proc)
        self.lines = []

    def line(self, timeout=10):
        result = []

        def read():
            result.append(self.proc.stdout.readline())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        check(result and result[0], "ops-client %s: no output within %d s" % (self.proc.args, timeout))
        self.lines.append(result[0].strip())
        return self.lines[-1]

    def finish(self, timeout=10):
        """Closes its stdin and returns (status, rest of its output)."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.stdin = None
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            fail("ops-client %s did not finish within %d s" % (self.proc.args, timeout))
        return self.proc.returncode, out


def run_client(*args, timeout=20):
    r = subprocess.run([OPS_CLIENT] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout.strip()
