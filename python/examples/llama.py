#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""stories260K on NumPy, its K/V cache in a kvpaged pool (import kvpaged), or a private array.

A Python twin of the C engine kvpaged-llama (tools/llama, docs/engine.md): the same model
(data/stories260K), the same options where they mean the same thing, and the same arithmetic,
bit for bit.  Each sum runs in the C engine's order (np.add.accumulate is sequential), every
operation is a float32 IEEE operation rounded on its own, e^x is llama_expf (model.h), made of
such operations only, and RoPE's powf, cosf and sinf are libm's, called through ctypes: the K/V
one engine commits to the pool is what the other would have computed, so each reuses the
other's prefixes and the logits agree to the bit.

    llama.py [--prompt TEXT] [--steps N] [--temperature T --seed S] [--fork N]
             [--park-at N [--park-wait FILE]] [--dump-logits FILE] [--json]
    llama.py --perplexity FILE [--dump-logits FILE] [--json]
    llama.py --contiguous ...            the private array instead of the pool

With the pool, a prompt is opened with OPEN_RECOMPUTE_LAST: its cached leading tokens are not
run at all; the rest are run one by one into the slots the block table gives and committed;
then each generated token is appended, run and committed, so another process may reuse a block
as soon as it is full.  --fork shares the prompt's blocks until copy-on-write separates them;
--park-at parks the sequence, waits (for --park-wait's file to appear) and resumes, running
again what did not come back.  Perplexity recomputes a story's cached prefix all the same (its
logits are needed) and checks its K/V against the pool's row by row instead of writing it.
"""
import argparse
import ctypes
import json
import os
import struct
import sys
import time

import numpy as np

import kvpaged
import kvpaged.rings
from kvpaged import Op

F = np.float32
F0, F1 = F(0), F(1)
BOS = 1
BYTE_TOKEN_BASE = 3  # <0x00> follows <unk>, <s> and </s>
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data",
                    "stories260K")
PARK_WAIT_TIMEOUT_S = 60
M64 = (1 << 64) - 1


def fail(msg: str) -> None:
    sys.stderr.write("llama.py: %s\n" % msg)
    sys.exit(1)


# ------------------------------------------------------------------------------ arithmetic

_LOG2E = F(float.fromhex("0x1.715476p+0"))
_LN2_HI = F(float.fromhex("0x1.63p-1"))
_LN2_LO = F(float.fromhex("-0x1.bd0106p-13"))
_POLY = [F1 / F(5040), F1 / F(720), F1 / F(120), F1 / F(24), F1 / F(6), F(0.5), F1, F1]


def _pow2(k: np.ndarray) -> np.ndarray:
    """2^k for integer k in [-126, 127], exactly, from its bits."""
    return ((k + 127) << 23).astype(np.int32).view(F)


def expf(x: np.ndarray) -> np.ndarray:
    """llama_expf (tools/llama/model.h) elementwise: the same operations in the same order.
    ldexpf(p, k) is p * 2^(k // 2) * 2^(k - k // 2): both factors are normal numbers for
    every k here (-150..128), the first product is exact and the second rounds once, to the
    value ldexpf rounds to."""
    with np.errstate(invalid="ignore", over="ignore"):
        xc = np.minimum(np.maximum(x, F(-104)), F(89))
        k = np.rint(xc * _LOG2E)
        r = (xc - k * _LN2_HI) - k * _LN2_LO
        p = r * _POLY[0] + _POLY[1]
        for c in _POLY[2:]:
            p = p * r + c
        ki = k.astype(np.int32)
        half = ki >> 1
        y = p * _pow2(half) * _pow2(ki - half)
        if not (x >= F(-104)).all():  # below -104: 0; NaN stays NaN
            y = np.where(x < F(-104), F0, y)
        if (x > F(89)).any():
            y = np.where(x > F(89), F(np.inf), y)
        return y


def _sum0_accumulate(a: np.ndarray) -> np.ndarray:
    return np.add.accumulate(a, axis=0)[-1] + F0


def _sum0_reduce(a: np.ndarray) -> np.ndarray:
    return np.add.reduce(np.ascontiguousarray(a), axis=0) + F0


def _reduce_is_sequential() -> bool:
    """Whether NumPy reduces the outer axis of a C-ordered array row after row, in order (it
    sums pairwise only along the innermost axis): then it is the fast way to the C loop's sum.
    Checked on random data of the forward pass's shapes, else accumulate it is."""
    rng = np.random.default_rng(1)
    for shape in ((300, 8), (300, 4, 2, 8), (64, 172), (172, 64), (64, 512), (2, 8)):
        a = rng.standard_normal(shape).astype(F)
        if _sum0_reduce(a).tobytes() != _sum0_accumulate(a).tobytes():
            return False
    return True


#: seqsum0(a): sums a along its first axis one term after another from 0.0f, as a C loop does
#: (the + 0 stands for that start: it only turns an all-zero sum's -0 into +0).
seqsum0 = _sum0_reduce if _reduce_is_sequential() else _sum0_accumulate


def seqsum_last(a: np.ndarray) -> np.ndarray:
    """The same along the last axis, unrolled: for short axes (a head's dimensions)."""
    s = a[..., 0] + F0
    for i in range(1, a.shape[-1]):
        s = s + a[..., i]
    return s


def matvec(wt: np.ndarray, x: np.ndarray) -> np.ndarray:
    """w [out][in] times x, w given transposed (wt [in][out], C order): each output one sum
    over in, in order (model.c's matmul)."""
    return seqsum0(wt * x[:, None])


def rmsnorm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    ss = np.add.accumulate(x * x)[-1] + F0
    ss = ss / F(x.shape[0])
    ss = ss + F(1e-5)
    ss = F1 / np.sqrt(ss)
    return weight * (ss * x)


class Libm:
    """libm's powf, cosf and sinf: the C engine's RoPE angles, computed by the same code."""

    def __init__(self):
        m = ctypes.CDLL("libm.so.6")
        self.powf, self.cosf, self.sinf = m.powf, m.cosf, m.sinf
        self.powf.restype = self.cosf.restype = self.sinf.restype = ctypes.c_float
        self.powf.argtypes = [ctypes.c_float, ctypes.c_float]
        self.cosf.argtypes = self.sinf.argtypes = [ctypes.c_float]


# ------------------------------------------------------------------------ model, tokenizer

class Model:
    """A llama2.c legacy checkpoint: the header's shape, float32 weights as views of the file."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            raw = f.read()
        if len(raw) < 28:
            fail("%s: too short for a checkpoint header" % path)
        dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28])
        self.shared = vocab > 0
        vocab = abs(vocab)
        self.dim, self.hidden, self.layers, self.heads = dim, hidden, layers, heads
        self.kv_heads, self.vocab, self.seq_len = kv_heads, vocab, seq_len
        self.head_size = dim // heads
        self.kv_dim = self.head_size * kv_heads
        self.kv_mul = heads // kv_heads
        w = np.frombuffer(raw, dtype="<f4", offset=28)
        D, H, L, KV, V = dim, hidden, layers, self.kv_dim, vocab
        shapes = [("emb", (V, D)), ("rms_att", (L, D)), ("wq", (L, D, D)), ("wk", (L, KV, D)),
                  ("wv", (L, KV, D)), ("wo", (L, D, D)), ("rms_ffn", (L, D)),
                  ("w1", (L, H, D)), ("w2", (L, D, H)), ("w3", (L, H, D)), ("rms_final", (D,)),
                  ("freq_cis", (seq_len * self.head_size,))]
        if not self.shared:
            shapes.append(("wcls", (V, D)))
        off = 0
        for name, shape in shapes:
            n = int(np.prod(shape))
            if off + n > w.size:
                fail("%s: shorter than its header says" % path)
            setattr(self, name, w[off:off + n].reshape(shape))
            off += n
        if off != w.size:
            fail("%s: %d bytes, but its header asks for %d" % (path, len(raw), 28 + 4 * off))
        if self.shared:
            self.wcls = self.emb
        # matvec takes [in][out]: transposed once, C order (the sums run down its rows).
        for name in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
            setattr(self, name + "_t", np.ascontiguousarray(getattr(self, name).transpose(0, 2, 1)))
        self.wcls_t = np.ascontiguousarray(self.wcls.T)
        self.fingerprint = fingerprint(raw)
        self._libm = Libm()
        self._cos = self._sin = np.zeros((0, self.head_size // 2), F)

    def rope(self, pos: int):
        """cos and sin of the rotation at pos, one per pair of a head's dimensions."""
        if pos >= self._cos.shape[0]:
            n = max(pos + 1, 2 * self._cos.shape[0], self.seq_len)
            half = self.head_size // 2
            cos, sin = np.zeros((n, half), F), np.zeros((n, half), F)
            freq = [F1 / F(self._libm.powf(10000.0, float(F(2 * j) / F(self.head_size))))
                    for j in range(half)]
            for p in range(n):
                for j in range(half):
                    val = F(p) * freq[j]
                    cos[p, j] = self._libm.cosf(float(val))
                    sin[p, j] = self._libm.sinf(float(val))
            self._cos, self._sin = cos, sin
        return self._cos[pos], self._sin[pos]


def fingerprint(raw: bytes) -> int:
    """llama_model_fingerprint: FNV-1a over 8-byte words, then an avalanche (the prefix key)."""
    h = 0xcbf29ce484222325 ^ len(raw)
    n8 = len(raw) // 8 * 8
    for w in np.frombuffer(raw[:n8], dtype="<u8").tolist():
        h = ((h ^ w) * 0x100000001b3) & M64
    for b in raw[n8:]:
        h = ((h ^ b) * 0x100000001b3) & M64
    h ^= h >> 33
    h = (h * 0xff51afd7ed558ccd) & M64
    h ^= h >> 33
    return h


class Tokenizer:
    """A llama2.c tokenizer file, encoded and decoded as tools/llama/tokenizer.c does."""

    def __init__(self, path: str, vocab_size: int):
        with open(path, "rb") as f:
            raw = f.read()
        self.pieces, self.scores, self.ids = [], [], {}
        off = 4
        for i in range(vocab_size):
            score, n = struct.unpack_from("<fi", raw, off)
            off += 8
            piece = raw[off:off + n]
            off += n
            self.pieces.append(piece)
            self.scores.append(score)
            self.ids.setdefault(piece, i)  # equal strings: the lowest id
        if off != len(raw):
            fail("%s: not a tokenizer of %d tokens" % (path, vocab_size))

    def encode(self, text: bytes, bos: bool = True) -> list:
        tokens = [BOS] if bos else []
        if text and b" " in self.ids:
            tokens.append(self.ids[b" "])  # SentencePiece's dummy prefix
        i = 0
        while i < len(text):
            j = i + 1
            while j < len(text) and j - i < 4 and text[j] & 0xC0 == 0x80:
                j += 1
            ch = text[i:j]
            if ch in self.ids:
                tokens.append(self.ids[ch])
            else:
                tokens.extend(b + BYTE_TOKEN_BASE for b in ch)
            i = j
        while True:  # merge the best-scoring adjacent pair (the first on ties)
            best, best_id, best_i = F(-1e10), -1, -1
            for i in range(len(tokens) - 1):
                t = self.ids.get(self.pieces[tokens[i]] + self.pieces[tokens[i + 1]], -1)
                if t >= 0 and F(self.scores[t]) > best:
                    best, best_id, best_i = F(self.scores[t]), t, i
            if best_i < 0:
                return tokens
            tokens[best_i:best_i + 2] = [best_id]

    def decode(self, prev: int, token: int) -> bytes:
        piece = self.pieces[token] if token < len(self.pieces) else b""
        if prev == BOS and piece[:1] == b" ":
            piece = piece[1:]
        if len(piece) == 6 and piece[:3] == b"<0x" and piece[5:] == b">":
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece


def text_piece(tok: Tokenizer, prev: int, token: int) -> bytes:
    """A token's text, without lone bytes that are neither printable nor space."""
    p = tok.decode(prev, token)
    if len(p) == 1 and not (0x20 <= p[0] <= 0x7E or p in b" \t\n\v\f\r"):
        return b""
    return p


# ------------------------------------------------------------------------------- K/V caches

class Contiguous:
    """A private cache: K and V of every position, [layer][position][kv head][dim]."""

    def __init__(self, m: Model, positions: int):
        shape = (m.layers, positions, m.kv_heads, m.head_size)
        self.k, self.v = np.zeros(shape, F), np.zeros(shape, F)

    def store(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        self.k[layer, pos] = k
        self.v[layer, pos] = v

    def rows(self, layer: int, n: int):
        return self.k[layer, :n], self.v[layer, :n]

    def fork(self, ntokens: int) -> "Contiguous":
        c = Contiguous.__new__(Contiguous)
        c.k, c.v = self.k.copy(), self.v.copy()
        return c

    def step(self, commit_ntokens: int, token: int, ntokens: int) -> None:
        pass

    def commit(self, ntokens: int) -> None:
        pass

    def close(self) -> None:
        pass


class Paged:
    """A sequence in the pool: position p is slot p % block_tokens of block table[p //
    block_tokens], [block, layer, kv, slot, head, dim] in pool.array().  Positions below
    readonly_below are cached (someone else's too): checked against the pool, never written.

    With the client's rings a decode step's commit and append go in one submission; with
    defer, a step whose token lands in a block the sequence already holds does not wait for
    them (the forward pass writes the slot meanwhile), and they are reaped, and checked to
    have changed nothing, before the next call (tools/llama/engine.c does the same)."""

    def __init__(self, engine, seq: "kvpaged.Sequence", readonly_below: int):
        self.engine, self.pool, self.seq = engine, engine.pool, seq
        self.bt = self.pool.shape[3]
        self.readonly_below = readonly_below
        self.compared = self.mismatched = 0
        self.inflight = self.inflight_len = 0
        self.refresh()

    def refresh(self) -> None:
        """Takes the sequence's block table again (after append, commit, fork, resume)."""
        self.table = self.seq.table
        if self.table.size and int(self.table.max()) >= self.pool.shape[0]:
            fail("the daemon returned a block table that does not fit the pool")

    def settle(self) -> None:
        """Reaps a deferred step's operations: they must have changed nothing."""
        if not self.inflight:
            return
        n, self.inflight = self.inflight, 0
        for d in self.engine.client.complete(min=n, max=n):
            if d.error:
                raise d.error
            if (d.aux != 0 or d.value != 0 if d.op.opcode == kvpaged.rings.COMMIT
                    else d.aux != self.inflight_len or len(d.table)):
                fail("the daemon changed the block table in a step that needed no block")

    def step(self, commit_ntokens: int, token: int, ntokens: int) -> None:
        """Commits the first commit_ntokens tokens (none: 0), then gives token the slot after
        the ntokens the sequence holds."""
        e = self.engine
        self.settle()
        if not e.rings:
            if commit_ntokens:
                self.seq.commit(commit_ntokens)
            self.seq.append([token])
            self.refresh()
            return
        ops = [Op.commit(self.seq, commit_ntokens)] if commit_ntokens else []
        ops.append(Op.append(self.seq, [token]))
        if e.client.submit(ops) != len(ops):
            fail("the rings took only part of a step")
        # A token starting a block needs it allocated, and the commit with it completes the
        # previous block, which the daemon may switch to an equal one: wait for those.
        if e.defer and ntokens % self.bt and len(self.table) * self.bt > ntokens:
            self.inflight, self.inflight_len = len(ops), len(self.table)
            return
        for d in e.client.complete(min=len(ops), max=len(ops)):
            if d.error:
                raise d.error
        self.refresh()

    def commit(self, ntokens: int) -> None:
        self.settle()
        self.seq.commit(ntokens)
        self.refresh()

    def store(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        b, s = self.table[pos // self.bt], pos % self.bt
        if pos < self.readonly_below:
            self.compared += 1
            if (self.pool[b, layer, 0, s].tobytes() != k.tobytes() or
                    self.pool[b, layer, 1, s].tobytes() != v.tobytes()):
                self.mismatched += 1
            return
        self.pool[b, layer, 0, s] = k
        self.pool[b, layer, 1, s] = v

    def rows(self, layer: int, n: int):
        blocks = self.table[:(n + self.bt - 1) // self.bt]
        kv = self.pool[blocks, layer]  # a copy: [block, kv, slot, head, dim]
        shape = (-1,) + kv.shape[3:]
        return kv[:, 0].reshape(shape)[:n], kv[:, 1].reshape(shape)[:n]

    def fork(self, ntokens: int) -> "Paged":
        self.settle()
        return Paged(self.engine, self.seq.fork(), ntokens)

    def park(self) -> None:
        self.settle()
        self.seq.park()

    def resume(self) -> int:
        recompute = self.seq.resume()
        self.refresh()
        self.readonly_below = 0
        return recompute

    def close(self) -> None:
        self.settle()
        self.seq.close()


# --------------------------------------------------------------------------- forward pass

def forward(m: Model, kv, token: int, pos: int) -> np.ndarray:
    """Runs token at pos: stores its K/V in kv, attends over [0, pos]; returns the logits."""
    hs, kvh, mul = m.head_size, m.kv_heads, m.kv_mul
    x = m.emb[token].copy()
    cos, sin = m.rope(pos)
    cq, sq = np.tile(cos, m.heads), np.tile(sin, m.heads)
    ck, sk = np.tile(cos, kvh), np.tile(sin, kvh)
    scale = np.sqrt(F(hs))
    n = pos + 1
    for l in range(m.layers):
        xb = rmsnorm(x, m.rms_att[l])
        q = matvec(m.wq_t[l], xb).reshape(-1, 2)
        k = matvec(m.wk_t[l], xb).reshape(-1, 2)
        v = matvec(m.wv_t[l], xb)
        q = np.stack([q[:, 0] * cq - q[:, 1] * sq, q[:, 0] * sq + q[:, 1] * cq], axis=1)
        k = np.stack([k[:, 0] * ck - k[:, 1] * sk, k[:, 0] * sk + k[:, 1] * ck], axis=1)
        kv.store(l, pos, k.reshape(kvh, hs), v.reshape(kvh, hs))

        keys, values = kv.rows(l, n)  # [position][kv head][dim]
        q = q.reshape(kvh, mul, hs)
        score = seqsum_last(keys[:, :, None, :] * q[None]).reshape(n, m.heads) / scale
        att = expf(score - score.max(axis=0))
        att = att / seqsum0(att)
        out = seqsum0(att.reshape(n, kvh, mul, 1) * values[:, :, None, :])
        x = x + matvec(m.wo_t[l], out.reshape(-1))

        xb = rmsnorm(x, m.rms_ffn[l])
        h1 = matvec(m.w1_t[l], xb)
        h3 = matvec(m.w3_t[l], xb)
        h1 = h1 * (F1 / (F1 + expf(-h1)))
        h1 = h1 * h3
        x = x + matvec(m.w2_t[l], h1)
    return matvec(m.wcls_t, rmsnorm(x, m.rms_final))


# ------------------------------------------------------------------------------- sampling

def rng_seed(seed: int) -> int:
    z = (seed + 0x9e3779b97f4a7c15) & M64
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    z ^= z >> 31
    return z or 1


def rng_u32(state: list) -> int:
    s = state[0]
    s ^= s >> 12
    s = (s ^ (s << 25)) & M64
    s ^= s >> 27
    state[0] = s
    return ((s * 0x2545F4914F6CDD1D) & M64) >> 32


def sample(logits: np.ndarray, temperature: np.float32, rng: list) -> int:
    """generate.c's sample(): argmax at temperature 0, else the softmax's inverse CDF."""
    if temperature == F0:
        return int(np.argmax(logits))
    probs = logits / temperature
    probs = expf(probs - probs.max())
    cdf = np.add.accumulate(probs / seqsum0(probs))
    coin = F(rng_u32(rng) >> 8) / F(16777216)
    hit = np.flatnonzero(coin < cdf)
    return int(hit[0]) if hit.size else len(logits) - 1


# ------------------------------------------------------------------------------- sessions

class Engine:
    def __init__(self, args):
        self.m = Model(args.model or os.path.join(DATA, "stories260K.bin"))
        self.tok = Tokenizer(args.tokenizer or os.path.join(DATA, "tok512.bin"), self.m.vocab)
        self.client = self.pool = None
        self.rings = not args.contiguous and not args.no_rings
        self.defer = self.rings and not args.no_defer
        if not args.contiguous:
            self.client = kvpaged.connect(socket=args.socket, pool=args.pool,
                                          name="llama.py", ring_entries=16 if self.rings else 0)
            p = self.client.pool
            m = self.m
            if (p.layers, p.kv_heads, p.head_dim, p.element_bytes) != \
                    (m.layers, m.kv_heads, m.head_size, 4):
                fail("pool '%s' is %u layers x %u kv heads x head_dim %u x %u-byte elements; "
                     "the model needs %u x %u x %u x 4 (float32)" %
                     (p.name, p.layers, p.kv_heads, p.head_dim, p.element_bytes, m.layers,
                      m.kv_heads, m.head_size))
            if p.window:
                fail("pool '%s' has a sliding window of %u tokens: this engine attends to "
                     "every position (the C engine's --window does bounded attention)" %
                     (p.name, p.window))
            self.pool = p.array(np.float32)

    @property
    def mode(self) -> str:
        return "paged" if self.client else "contiguous"

    def open(self, tokens: list, flags: int):
        """A cache for a sequence of tokens: (cache, cached tokens)."""
        if not self.client:
            return Contiguous(self.m, self.m.seq_len), 0
        s = self.client.open(tokens, extra_key=self.m.fingerprint, flags=flags)
        if s.cached > len(tokens):
            fail("the daemon says %d of %d tokens are cached" % (s.cached, len(tokens)))
        return Paged(self, s, s.cached), s.cached

    def close(self) -> None:
        self.pool = None
        if self.client:
            try:
                self.client.close()
            except BufferError:
                pass  # a failed run's frames still hold arrays: the exit disconnects


def wait_for_file(path: str) -> None:
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > PARK_WAIT_TIMEOUT_S:
            fail("--park-wait: %s did not appear within %d s" % (path, PARK_WAIT_TIMEOUT_S))
        time.sleep(0.01)


def park_and_resume(e: Engine, c: dict, history: list, args) -> int:
    """Parks with every token committed, waits, resumes; the tokens whose K/V did not come back
    are run again, and the last one's logits must be bitwise those before the park."""
    kv = c["kv"]
    if c["uncommitted"]:
        kv.commit(c["uncommitted"])
        c["uncommitted"] = 0
    kv.park()
    print("parked: %d tokens, %d generated" % (c["ntokens"], c["generated"]), flush=True)
    if args.park_wait:
        wait_for_file(args.park_wait)
    recompute = kv.resume()
    logits = None
    for pos in range(c["ntokens"] - recompute, c["ntokens"]):
        logits = forward(e.m, kv, history[pos], pos)
    if logits is not None and logits.tobytes() != c["logits"].tobytes():
        fail("resume: the last token's logits, recomputed over the blocks that came back, "
             "differ from before the park")
    if recompute:
        kv.commit(c["ntokens"])
    print("resumed: %d of %d tokens recomputed" % (recompute, c["ntokens"]), flush=True)
    return recompute


def dump_open(path, i: int, n: int):
    if not path:
        return None
    return open(path if n == 1 else "%s.%d" % (path, i), "wb")


def generate(e: Engine, args) -> None:
    m = e.m
    tokens = e.tok.encode(args.prompt.encode())
    n = len(tokens)
    if n > m.seq_len:
        fail("the prompt is %d tokens; the model takes %d" % (n, m.seq_len))
    steps = min(args.steps, m.seq_len - n + 1)
    if args.park_at is not None and (args.fork != 1 or not e.client):
        fail("--park-at parks one paged sequence")
    temperature = F(args.temperature)
    # Forks share their last block until copy-on-write: their steps always wait.
    e.defer = e.rings and not args.no_defer and args.fork == 1
    history = list(tokens)
    t_start = time.monotonic()
    kv, cached = e.open(tokens, kvpaged.OPEN_RECOMPUTE_LAST)
    if cached >= n:
        fail("the daemon says all %d prompt tokens are cached, though the last one was to "
             "be left to recompute" % n)
    for pos in range(cached, n):
        logits = forward(m, kv, tokens[pos], pos)
    kv.commit(n)
    t_prefilled = time.monotonic()

    conts = []
    for i in range(args.fork):
        c = {"kv": kv if i == 0 else kv.fork(n), "logits": logits.copy(),
             "rng": [rng_seed(args.seed + i)], "ntokens": n, "prev": tokens[n - 1],
             "text": b"".join(text_piece(e.tok, tokens[p - 1], tokens[p]) for p in range(1, n)),
             "generated": 0, "uncommitted": 0, "done": False,
             "dump": dump_open(args.dump_logits, i, args.fork)}
        conts.append(c)

    forwards, t_first, t_parked, recompute, parked = 0, None, 0.0, 0, False
    for step in range(steps):  # round robin: the forks' first writes interleave
        for c in conts:
            if c["done"]:
                continue
            if args.park_at is not None and not parked and c["generated"] == args.park_at:
                t_park = time.monotonic()
                recompute = park_and_resume(e, c, history, args)
                parked = True
                t_parked = time.monotonic() - t_park
            if c["dump"]:
                c["dump"].write(c["logits"].tobytes())
            nxt = sample(c["logits"], temperature, c["rng"])
            if t_first is None:
                t_first = time.monotonic()
            if nxt == BOS:  # the next story: this one is over
                c["done"] = True
                continue
            c["text"] += text_piece(e.tok, c["prev"], nxt)
            c["prev"] = nxt
            c["generated"] += 1
            if step + 1 == steps:
                continue
            c["kv"].step(c["uncommitted"], nxt, c["ntokens"])
            history.append(nxt)
            c["logits"] = forward(m, c["kv"], nxt, c["ntokens"])
            c["ntokens"] += 1
            c["uncommitted"] = c["ntokens"]
            forwards += 1
    for c in conts:
        if c["uncommitted"]:
            c["kv"].commit(c["uncommitted"])
        if c["dump"]:
            c["dump"].close()
    t_end = time.monotonic()
    for c in conts:
        c["kv"].close()

    def rate(k, s):
        return k / s if s > 0 else 0.0
    texts = [c["text"].decode("utf-8", "replace") for c in conts]
    decode = rate(forwards, t_end - t_prefilled - t_parked)
    prefill = rate(n - cached, t_prefilled - t_start)
    ttft = ((t_first or t_end) - t_start - (0 if args.park_at else t_parked)) * 1e3
    for i, t in enumerate(texts):
        if args.fork > 1:
            print("--- continuation %d/%d ---" % (i + 1, args.fork))
        print(t)
    if args.json:
        out = {"mode": e.mode, "prompt_tokens": n, "prefilled": n - cached, "reused": cached,
               "generated": sum(c["generated"] for c in conts), "continuations": args.fork,
               "decode_forwards": forwards, "prefill_tok_s": round(prefill, 1),
               "decode_tok_s": round(decode, 1), "ttft_ms": round(ttft, 3)}
        if args.park_at is not None:
            out.update(parked=parked, resumed_recompute=recompute)
        out["texts"] = texts
        print(json.dumps(out))
    else:
        print("[%s] prefilled %d tokens, reused %d (cached); prefill %.1f tok/s, decode %.1f "
              "tok/s (%d tokens), first token %.3f ms" %
              (e.mode, n - cached, cached, prefill, decode,
               sum(c["generated"] for c in conts), ttft))


def nll(logits: np.ndarray, target: int) -> float:
    """-log softmax(logits)[target], in double (perplexity.c's nll)."""
    l64 = logits.astype(np.float64)
    mx = l64.max()
    return float(np.log(np.add.accumulate(np.exp(l64 - mx))[-1]) + mx - l64[target])


def perplexity(e: Engine, args) -> None:
    with open(args.perplexity, "rb") as f:
        text = f.read()
    total, predicted, stories, reused, checked = 0.0, 0, 0, 0, 0
    dump = dump_open(args.dump_logits, 0, 1)
    t0 = time.monotonic()
    for story in text.split(b"<|endoftext|>"):
        story = story.strip(b" \t\n\v\f\r")
        if not story:
            continue
        tokens = e.tok.encode(story)
        if len(tokens) > e.m.seq_len:
            fail("a story is %d tokens; the model takes %d" % (len(tokens), e.m.seq_len))
        stories += 1
        kv, cached = e.open(tokens, 0)  # flags 0: every cached block counts, all rerun
        for pos in range(len(tokens) - 1):
            logits = forward(e.m, kv, tokens[pos], pos)
            total += nll(logits, tokens[pos + 1])
            if dump:
                dump.write(logits.tobytes())
        kv.commit(len(tokens) - 1)
        if isinstance(kv, Paged):
            if kv.mismatched:
                fail("story %d: %d of %d cached K/V rows differ from ours" %
                     (stories, kv.mismatched, kv.compared))
            reused += cached
            checked += kv.compared
        kv.close()
        predicted += len(tokens) - 1
    if dump:
        dump.close()
    if not predicted:
        fail("%s: no text to score" % args.perplexity)
    per = total / predicted
    tok_s = predicted / (time.monotonic() - t0)
    if args.json:
        print(json.dumps({"mode": e.mode, "nats_per_token": round(per, 6),
                          "perplexity": round(float(np.exp(per)), 6), "tokens": predicted,
                          "stories": stories, "reused": reused, "checked_rows": checked,
                          "tok_s": round(tok_s, 1)}))
    else:
        print("[%s] %.6f nats/token (perplexity %.4f) over %d tokens in %d stories; reused %d "
              "(cached; %d K/V rows equal to the pool's); %.1f tok/s" %
              (e.mode, per, np.exp(per), predicted, stories, reused, checked, tok_s))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--tokenizer")
    ap.add_argument("--prompt", default="")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fork", type=int, default=1, help="continuations of the prompt")
    ap.add_argument("--perplexity", metavar="FILE")
    ap.add_argument("--dump-logits", metavar="FILE")
    ap.add_argument("--contiguous", action="store_true", help="a private cache, no daemon")
    ap.add_argument("--socket")
    ap.add_argument("--pool")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-rings", action="store_true", help="socket calls only")
    ap.add_argument("--no-defer", action="store_true", help="every decode step waits")
    ap.add_argument("--park-at", type=int, metavar="N")
    ap.add_argument("--park-wait", metavar="FILE")
    args = ap.parse_args(argv)
    if args.fork < 1 or args.steps < 0:
        fail("--fork takes at least 1, --steps at least 0")
    e = Engine(args)
    try:
        if args.perplexity:
            perplexity(e, args)
        else:
            generate(e, args)
    except kvpaged.Error as err:
        fail(str(err))
    finally:
        e.close()


if __name__ == "__main__":
    main()
