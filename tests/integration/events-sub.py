#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A KV event subscriber as a router would write one, by vLLM's schema
(vllm/distributed/kv_events.py): decodes every batch and prints it as one JSON line, hashes in
hex (JSON numbers lose 64-bit integers), each event normalised to its fields by name whichever
format (map or positional array) it came in.  Any deviation from the schema is an error.

  events-sub.py listen ENDPOINT           subscribe; "ready" once connected; a line per batch
  events-sub.py replay ENDPOINT START     ask the replay socket for batches from START; a line
                                          per batch, then "end"
  events-sub.py stall ENDPOINT            subscribe and never read (a receive queue of one
                                          message): a subscriber that fell behind for good

With EVENTS_SUB_RAW=FILE, listen also appends each message's frames to FILE in hex.  With
EVENTS_SUB_CURVE="SERVER-PUBLIC CLIENT-PUBLIC CLIENT-SECRET" (Z85), the sockets speak CURVE.
"""
import json
import os
import sys
import time

import msgpack
import zmq

STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"]
REMOVED = ["block_hashes", "medium"]


def fail(why):
    print("schema: " + why, file=sys.stderr, flush=True)
    sys.exit(3)


def u64(v, what):
    if not isinstance(v, int) or v < 0 or v >= 1 << 64:
        fail("%s is not an unsigned 64-bit integer: %r" % (what, v))
    return "%016x" % v


def event(ev):
    if isinstance(ev, dict):
        kind = ev.get("type")
        fields = {k: ev[k] for k in ev if k != "type"}
        form = "map"
    elif isinstance(ev, list) and ev and isinstance(ev[0], str):
        kind = ev[0]
        names = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": []}.get(kind)
        if names is None or len(ev) - 1 != len(names):
            fail("positional event %r" % (ev,))
        fields = dict(zip(names, ev[1:]))
        form = "array"
    else:
        fail("an event that is neither a map nor a tagged array: %r" % (ev,))
    want = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": []}.get(kind)
    if want is None or sorted(fields) != sorted(want):
        fail("%s with fields %s" % (kind, sorted(fields)))
    out = {"type": kind, "format": form}
    if kind == "AllBlocksCleared":
        return out
    if not isinstance(fields["block_hashes"], list) or not fields["block_hashes"]:
        fail("block_hashes %r" % (fields["block_hashes"],))
    out["block_hashes"] = [u64(h, "a block hash") for h in fields["block_hashes"]]
    if fields["medium"] not in ("GPU", "CPU", "STORAGE"):
        fail("medium %r" % (fields["medium"],))
    out["medium"] = fields["medium"]
    if kind == "BlockStored":
        p = fields["parent_block_hash"]
        out["parent_block_hash"] = None if p is None else u64(p, "a parent hash")
        toks = fields["token_ids"]
        if not isinstance(toks, list) or not all(isinstance(t, int) and t >= 0 for t in toks):
            fail("token_ids %r" % (toks,))
        out["token_ids"] = toks
        if not isinstance(fields["block_size"], int) or fields["block_size"] <= 0:
            fail("block_size %r" % (fields["block_size"],))
        out["block_size"] = fields["block_size"]
        if len(toks) != fields["block_size"] * len(fields["block_hashes"]):
            fail("%d token ids for %d blocks of %d" % (len(toks), len(fields["block_hashes"]),
                                                      fields["block_size"]))
        if fields["lora_id"] is not None:
            fail("lora_id %r" % (fields["lora_id"],))
    return out


def batch(topic, seq, payload):
    if len(seq) != 8:
        fail("seq of %d bytes" % len(seq))
    b = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(b, list) or len(b) != 3 or not isinstance(b[0], float) or \
            not isinstance(b[1], list) or b[2] is not None:
        fail("a batch that is not [ts, [events], nil]: %r" % (b,))
    return {"topic": topic.decode(), "seq": int.from_bytes(seq, "big"), "ts": b[0],
            "events": [event(e) for e in b[1]]}


def curve(sock):
    keys = os.environ.get("EVENTS_SUB_CURVE")
    if keys:
        server, public, secret = keys.split()
        sock.curve_serverkey = server.encode()
        sock.curve_publickey = public.encode()
        sock.curve_secretkey = secret.encode()


def main():
    ctx = zmq.Context()
    if sys.argv[1] == "stall":
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 1)
        sub.setsockopt(zmq.RCVBUF, 4096)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        curve(sub)
        sub.connect(sys.argv[2])
        print("ready", flush=True)
        while True:
            time.sleep(3600)
    if sys.argv[1] == "listen":
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        curve(sub)
        sub.connect(sys.argv[2])
        print("ready", flush=True)
        while True:
            frames = sub.recv_multipart()
            if len(frames) != 3:
                fail("a message of %d frames" % len(frames))
            if os.environ.get("EVENTS_SUB_RAW"):
                # The frames as they came, for docs/events.md's example.
                with open(os.environ["EVENTS_SUB_RAW"], "a") as f:
                    f.write(" ".join(x.hex() for x in frames) + "\n")
            print(json.dumps(batch(*frames)), flush=True)
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.RCVTIMEO, 5000)
    curve(req)
    req.connect(sys.argv[2])
    req.send_multipart([b"", int(sys.argv[3]).to_bytes(8, "big")])
    while True:
        frames = req.recv_multipart()
        if len(frames) != 3 or frames[0] != b"":
            fail("a replay reply of %d frames" % len(frames))
        if frames[1] == (-1).to_bytes(8, "big", signed=True):
            print("end", flush=True)
            return
        print(json.dumps(batch(b"", frames[1], frames[2])), flush=True)


if __name__ == "__main__":
    main()
