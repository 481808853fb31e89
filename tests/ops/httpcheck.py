#!/usr/bin/python3
# HTTP for tests/ops/prometheus.test, with nothing but Python's standard library.
#
#   httpcheck.py free-port                  a TCP port free on 127.0.0.1 (now)
#   httpcheck.py request PORT METHOD PATH [PADDING_BYTES [BODY_FILE]]
#                                           one request (with a header of that many bytes);
#                                           prints "status=N allow=... type=... length=N"
#   httpcheck.py refused PORT               a GET on a new connection gets no answer: the
#                                           daemon closed it at accept (exit 0), or it answered
#                                           (exit 1, the status line printed)
#   httpcheck.py query PORT PROMQL          Prometheus's /api/v1/query: one line per series,
#                                           "name{label="value",...} value", sorted
#   httpcheck.py rules PORT                 Prometheus's /api/v1/rules: "group rule" lines
import http.client
import json
import socket
import sys
import urllib.parse
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])


def request(port, method, path, padding=0, body_file=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.putrequest(method, path)
    if padding:
        c.putheader("X-Padding", "a" * padding)
    c.endheaders()
    r = c.getresponse()
    body = r.read()
    if body_file:
        with open(body_file, "wb") as f:
            f.write(body)
    print("status=%d allow=%s type=%s length=%d"
          % (r.status, r.getheader("Allow", ""), r.getheader("Content-Type", ""), len(body)))


def refused(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: kvpaged\r\n\r\n")
        data = s.recv(4096)
    except (ConnectionResetError, BrokenPipeError):
        data = b""
    except socket.timeout:
        print("no answer and not closed within 30 s")
        return 1
    if data:
        print("answered: %s" % data.split(b"\r\n")[0].decode(errors="replace"))
        return 1
    print("closed at accept")
    return 0


def api(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=30) as r:
        reply = json.load(r)
    if reply.get("status") != "success":
        raise SystemExit("prometheus: %s" % reply)
    return reply["data"]


def query(port, promql):
    data = api(port, "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    lines = []
    for series in data["result"]:
        metric = dict(series["metric"])
        name = metric.pop("__name__", "")
        labels = ",".join('%s="%s"' % (k, metric[k]) for k in sorted(metric)
                          if k not in ("instance", "job"))
        lines.append("%s{%s} %s" % (name, labels, series["value"][1]))
    print("\n".join(sorted(lines)))


def rules(port):
    for group in api(port, "/api/v1/rules")["groups"]:
        for rule in group["rules"]:
            print("%s %s" % (group["name"], rule["name"]))


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "free-port":
        free_port()
    elif mode == "request":
        request(int(args[0]), args[1], args[2], int(args[3]) if len(args) > 3 else 0,
                args[4] if len(args) > 4 else None)
    elif mode == "refused":
        sys.exit(refused(int(args[0])))
    elif mode == "query":
        query(int(args[0]), args[1])
    elif mode == "rules":
        rules(int(args[0]))
    else:
        raise SystemExit("unknown mode %s" % mode)
