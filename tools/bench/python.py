#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The Python binding's cost beside the C library's, in the same run (docs/bench.md "python").

    tools/bench/python.py --daemon SOCKET --bench KVPAGED-BENCH [--rounds N] [--json]
                          [--llama EXAMPLE --iterations N --seconds S --steps N]

Each round runs, one after another against the same daemon:
- socket: one-token appends over the socket, each timed on its own; p50 in us.  C:
  `kvpaged-bench latency`'s socket row; Python: Sequence.append([token]).
- batch: 64 one-token appends in one submission on the rings, then all 64 completed (the
  clients sleep: spin_us 0); the time of one batch in us.  C: `kvpaged-bench throughput
  --clients 1 --batch 64`; Python: Client.submit of 64 Op.append and Client.complete, and the
  same through submit_raw/complete_raw over a prepared OP_DTYPE array.
- decode (with --llama): python/examples/llama.py's decode tokens/s, paged and --contiguous.
As kvpaged-bench, every 4,096 tokens the sequence is closed and reopened, untimed.
Medians over the rounds; the ratios are of the medians (Python over C: lower is better;
paged over contiguous: higher is better).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import kvpaged

SEQ_MAX = 4096
BATCH = 64


def c_bench(bench, sock, args):
    out = subprocess.run([bench] + args + ["--daemon", sock, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def py_socket(sock, iterations):
    times = []
    with kvpaged.connect(sock, name="bench-python") as c:
        warm = max(10, min(2000, iterations // 10))
        s, n = c.open([1]), 1
        for i in range(warm + iterations):
            if n >= SEQ_MAX:
                s.close()
                s, n = c.open([1]), 1
            t0 = time.perf_counter_ns()
            s.append([i & 0xFFFF])
            t1 = time.perf_counter_ns()
            n += 1
            if i >= warm:
                times.append((t1 - t0) / 1e3)
        s.close()
    return statistics.median(times)


def py_batch(sock, seconds, raw):
    """us per batch of 64 appends over the rings."""
    with kvpaged.connect(sock, name="bench-python", ring_entries=BATCH) as c:
        s, n = c.open([1]), 1
        toks = np.arange(BATCH, dtype=np.uint32)
        ops = np.zeros(BATCH, dtype=kvpaged.OP_DTYPE)
        ops["opcode"], ops["ntokens"], ops["user_data"] = 2, 1, np.arange(BATCH)
        ops["tokens"] = toks.ctypes.data + 4 * np.arange(BATCH)
        out = np.zeros(BATCH, dtype=kvpaged.COMPLETION_DTYPE)
        batches = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if n + BATCH > SEQ_MAX:
                s.close()
                s, n = c.open([1]), 1
            if raw:
                ops["seq"] = s.id
                sent = c.submit_raw(ops)
                got = 0
                while got < sent:
                    got += c.complete_raw(out[got:], min=sent - got)
            else:
                sent = c.submit([kvpaged.Op.append(s, [t]) for t in range(BATCH)])
                got = 0
                while got < sent:
                    got += len(c.complete(min=sent - got, max=BATCH))
            assert sent == BATCH
            n += BATCH
            batches += 1
        wall = time.perf_counter() - t0
        s.close()
    return wall / batches * 1e6


def decode(llama, sock, steps, contiguous):
    cmd = [sys.executable, llama, "--json", "--steps", str(steps)]
    if contiguous:
        cmd.append("--contiguous")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, KVPAGED_SOCKET=sock)).stdout
    return json.loads(out.strip().splitlines()[-1])["decode_tok_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--daemon", required=True, metavar="SOCKET")
    ap.add_argument("--bench", required=True, help="the kvpaged-bench binary")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--llama", help="python/examples/llama.py: measure its decode too")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = {k: [] for k in ("c_socket_p50_us", "py_socket_p50_us", "c_batch64_us",
                            "py_batch64_us", "py_raw_batch64_us", "contiguous_decode_tok_s",
                            "paged_decode_tok_s")}
    for r in range(a.rounds):
        lat = c_bench(a.bench, a.daemon, ["latency", "--iterations", str(a.iterations)])
        rows["c_socket_p50_us"].append(lat["socket_p50_us"])
        rows["py_socket_p50_us"].append(py_socket(a.daemon, a.iterations))
        thr = c_bench(a.bench, a.daemon, ["throughput", "--clients", "1", "--batch",
                                          str(BATCH), "--seconds", str(a.seconds)])
        rows["c_batch64_us"].append(BATCH / thr["ops_per_s"] * 1e6)
        rows["py_batch64_us"].append(py_batch(a.daemon, a.seconds, False))
        rows["py_raw_batch64_us"].append(py_batch(a.daemon, a.seconds, True))
        if a.llama:
            rows["contiguous_decode_tok_s"].append(decode(a.llama, a.daemon, a.steps, True))
            rows["paged_decode_tok_s"].append(decode(a.llama, a.daemon, a.steps, False))
        if not a.json:
            print("round %d: %s" % (r + 1, ", ".join("%s %.1f" % (k, v[-1])
                                                     for k, v in rows.items() if v)),
                  flush=True)
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    res = {"rounds": a.rounds, **{k: round(v, 2) for k, v in med.items()},
           "socket_py_vs_c": round(med["py_socket_p50_us"] / med["c_socket_p50_us"], 3),
           "batch64_py_vs_c": round(med["py_batch64_us"] / med["c_batch64_us"], 3),
           "batch64_raw_py_vs_c": round(med["py_raw_batch64_us"] / med["c_batch64_us"], 3)}
    if a.llama:
        res["decode_paged_vs_contiguous"] = round(
            med["paged_decode_tok_s"] / med["contiguous_decode_tok_s"], 3)
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print("%-28s %s" % (k, v))


if __name__ == "__main__":
    main()
