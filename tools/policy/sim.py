#!/usr/bin/python3
"""Prefix-cache eviction simulator for the Mooncake synthetic trace (kvpaged research).

Model (matches kvpaged's in-process replay, tools/bench/workload.c, prompts only):
  requests run one at a time in file order; a request's prompt is its chain of 512-token
  blocks (hash_ids); the last block is partial when input_length % 512 != 0 and is never
  cached.  open: the longest cached prefix of the chain hits (at most the full blocks); hit
  blocks become referenced and leave the cache.  The misses are allocated from free blocks,
  then by evicting cached blocks.  close: every full block becomes cached again, released
  last-to-first.  hit fraction = hit blocks / prompt blocks (partial ones included).  A
  request whose blocks exceed the capacity is rejected and counted nowhere (as the C replay).

The engine keeps the chain structure (parent, number of cached children, the largest order
key among a block's cached children) and counts a violation whenever a block with cached
children is evicted (0 for every policy here).  Key policies (lru, oracle, belady,
value-deadline, value-odds) evict the smallest key, a block's key raised to its cached
children's largest; the value policy ('seg' mode) keeps one FIFO segment per feature class
and never evicts a block that has cached children (see Value.victim).

Policies: lru, oracle (knows whether each chain end is extended later), belady (offline
optimum), value (the online model, REPORT.md), value-size, value-depth, value-nockpt,
value-guard, value-deadline, value-odds (variants and failures).  --set k=v overrides a
value parameter (DEFAULTS).  --cold also replays the second half alone from an empty cache.

Usage: sim.py --policy lru,value --capacity 1000,5000,10000 [--cold] [--set k=v] [--json]
"""
import argparse
import bisect
import heapq
import json
import math
import os
import sys
from collections import OrderedDict, deque

# The project's shared traces sit beside the repository (../shared/traces).
TRACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'shared',
                     'traces', 'mooncake', 'synthetic_trace.jsonl')
B = 512
NEG = float('-inf')


def load(path=TRACE):
    reqs = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            reqs.append((r['timestamp'] / 1000.0, r['input_length'] // B, r['hash_ids']))
    return reqs


class Engine:
    """The cache: which blocks are cached, chain structure, counting.  The policy orders the
    cached blocks (insert / remove / victim)."""

    def __init__(self, reqs, capacity, policy, split=1997):
        self.reqs, self.cap, self.pol, self.split = reqs, capacity, policy, split
        self.cached = set()
        self.parent = {}          # hash -> parent hash (or None)
        self.ncc = {}             # hash -> number of cached children
        self.maxchild = {}        # hash -> largest order key among cached children
        self.violations = 0
        self.evictions = 0
        self.rejected = 0
        self.hits = [0, 0]
        self.blocks = [0, 0]
        policy.attach(self)

    def _uncache(self, h):
        self.cached.discard(h)
        self.pol.remove(h)
        p = self.parent.get(h)
        if p is not None:
            n = self.ncc[p] - 1
            self.ncc[p] = n
            if n == 0:
                del self.maxchild[p]

    def evict_one(self, now):
        h = self.pol.victim(now)
        if self.ncc.get(h, 0):
            self.violations += 1
        self._uncache(h)
        self.evictions += 1
        self.pol.evicted(h, now)

    def run(self, lo=0, hi=None):
        reqs = self.reqs
        hi = len(reqs) if hi is None else hi
        pol, cap, cached = self.pol, self.cap, self.cached
        for i in range(lo, hi):
            t, nf, h = reqs[i]
            n = len(h)
            if n > cap:
                self.rejected += 1
                continue
            for j in range(1, n):
                self.parent.setdefault(h[j], h[j - 1])
            self.parent.setdefault(h[0], None)
            k = 0
            while k < nf and h[k] in cached:
                k += 1
            half = 0 if i < self.split else 1
            self.hits[half] += k
            self.blocks[half] += n
            pol.opened(i, t, h, nf, k)
            for j in range(k):
                self._uncache(h[j])
            # blocks of this chain beyond the hit still cached (only if leaf-first broke)
            for j in range(k, nf):
                if h[j] in cached:
                    self._uncache(h[j])
            while cap - len(cached) - k < n - k:
                self.evict_one(t)
            pol.closing(i, t, h, nf, k)
            # close: release last-to-first; each block's order key is at least its cached
            # children's (leaf-first)
            for j in range(nf - 1, -1, -1):
                b = h[j]
                key = pol.insert(b, i, t, j, self.maxchild.get(b))
                cached.add(b)
                p = self.parent[b]
                if p is not None:
                    self.ncc[p] = self.ncc.get(p, 0) + 1
                    mc = self.maxchild.get(p)
                    if mc is None or key > mc:
                        self.maxchild[p] = key
            pol.closed(i, t, h, nf, k)
        return self

    def result(self):
        H, N = self.hits, self.blocks
        return {'whole': (H[0] + H[1]) / max(1, N[0] + N[1]),
                'first': H[0] / max(1, N[0]), 'second': H[1] / max(1, N[1]),
                'hits': H[0] + H[1], 'blocks': N[0] + N[1], 'evictions': self.evictions,
                'violations': self.violations, 'rejected': self.rejected}


class Policy:
    """Base: a key-ordered cache (smallest key evicted first; ties: released first)."""

    def attach(self, eng):
        self.eng = eng
        self.heap = []
        self.entry = {}
        self.seq = 0

    def opened(self, i, t, h, nf, k):
        pass

    def closing(self, i, t, h, nf, k):
        pass

    def closed(self, i, t, h, nf, k):
        pass

    def evicted(self, h, now):
        pass

    def key(self, b, i, t, j):
        return float(self.seq)

    def insert(self, b, i, t, j, maxchild):
        key = self.key(b, i, t, j)
        if maxchild is not None and maxchild > key:
            key = maxchild
        self.seq += 1
        self.entry[b] = self.seq
        heapq.heappush(self.heap, (key, self.seq, b))
        if len(self.heap) > 4 * len(self.entry) + 4096:
            self.heap = [e for e in self.heap if self.entry.get(e[2]) == e[1]]
            heapq.heapify(self.heap)
        return key

    def remove(self, b):
        del self.entry[b]

    def victim(self, now):
        while True:
            key, seq, b = heapq.heappop(self.heap)
            if self.entry.get(b) == seq:
                return b


class LRU(Policy):
    """LRU leaf-first: the key is the release order."""


class OracleExt(Policy):
    """Offline oracle: knows whether each request's chain end is extended (or repeated) by a
    later request (not when); such runs go to an upper LRU segment."""

    def __init__(self, reqs):
        self.ext = [False] * len(reqs)
        pos = {}
        for i in range(len(reqs) - 1, -1, -1):
            t, nf, h = reqs[i]
            if nf and h[nf - 1] in pos:
                self.ext[i] = True
            for x in h[:nf]:
                pos[x] = i

    def key(self, b, i, t, j):
        return (1e12 if self.ext[i] else 0.0) + self.seq


class Belady(Policy):
    """Offline optimum reference: evict the block whose next use is farthest (leaf-first
    holds: a parent is used whenever its child is)."""

    def __init__(self, reqs):
        self.nxt = {}
        nu = [None] * len(reqs)
        pos = {}
        for i in range(len(reqs) - 1, -1, -1):
            t, nf, h = reqs[i]
            nu[i] = [pos.get(x, 1 << 40) for x in h[:nf]]
            for x in h[:nf]:
                pos[x] = i
        self.nu = nu

    def key(self, b, i, t, j):
        return -float(self.nu[i][j])


class Value(Policy):
    """The online value policy; the model is described in REPORT.md.

    Records: each closed sequence leaves one record (class, release time, depth, nf, mean log
    gap) in a FIFO of at most rec_mult * capacity records, cached or not.  With ckpt=True the
    record is indexed by its checkpoint blocks (chain positions n-1, n-2, n-4, n-8, ...).  At
    open, the deepest checkpoint among the prompt's full blocks says: at n-1, the prompt
    extends (or repeats) that chain: depth + 1, one reuse event of weight 1; elsewhere, it
    shares the first j+1 blocks (a sibling): a reuse event of weight (j+1)/n.  Each record
    logs at most one event (its first reuse).

    Statistics: per class and per age bin (octaves of the horizon H: 0, H/8, ... 16H, open),
    decayed counts X of reuse events and E of pending records that reached the bin (bin
    cursors over the record FIFO); hazard (X + n0 h_group) / (E + n0), the group (depth
    class) itself shrunk toward the pool.  From the hazards, per class, the hit density
        G_c(a) = max_{T > a} P(reused in (a, T] | pending at a) / E[time cached in (a, T]]
    made nonincreasing in age.

    Eviction ('seg', the chosen mode): one FIFO segment per class; a released run goes to its
    sequence's class, or its most valuable cached child's when that ranks higher (by G at age
    0); the victim is the head with the lowest G at its age; a head with cached children is
    skipped for the next-lowest head (the globally oldest head is always a leaf), so leaf-first
    is exact.  'deadline' and 'odds' modes (frozen keys) are failed variants (REPORT.md)."""

    def __init__(self, **kw):
        self.p = dict(DEFAULTS)
        self.p.update(kw)

    # ---- setup ----------------------------------------------------------------------
    def attach(self, eng):
        Policy.attach(self, eng)
        P = self.p
        self.mode = P['mode']
        self.spec = set(P['classes'].split('+'))
        self.cid = {}                   # class tuple -> id
        self.cnames = []
        self.X, self.E, self.G = [], [], []
        bo = P['bins_per_oct']
        self.edges = [0.0] + [2.0 ** (x / bo) for x in range(-bo * P['oct_below'],
                                                             bo * P['oct_above'] + 1)]
        self.J = len(self.edges)        # bin j = [edges[j], edges[j+1]); the last bin is open
        if self.mode == 'seg':
            self.segs = []              # one FIFO per class, created with the class
            self.seg_of = {}
        self.info = {}                  # cached block -> (class id, release time)
        self.H = None
        self.t0 = None
        self.mu = None                  # log of the marginal hit density (per H)
        self.recs = OrderedDict()       # chain-end hash -> record
        self.owner = {}                 # cached block -> record of the run that released it
        self.cp = {}                    # checkpoint block hash -> record (ckpt mode)
        self.rq = deque()               # records, oldest first (ckpt mode)
        self.order = []                 # records in release order (for the bin cursors)
        self.rec_max = max(64, int(P['rec_mult'] * eng.cap))
        self.cursor = [0] * self.J
        self.gamma = 1.0 - 1.0 / P['decay_n']
        import numpy as np
        self.np = np
        self.xg = np.array([0.0] + [2.0 ** (x / 8.0) for x in range(-8 * 7, 8 * 7 + 1)])
        self.iend = int(np.searchsorted(self.xg, self.edges[-1]))
        self.nreq = 0
        self.cur = None
        self.fallbacks = 0
        self.relocations = 0
        self.shadow = OrderedDict()     # guard: LRU replay on hashes
        self.duel = 0.0
        self.gamma_g = 1.0 - 1.0 / P['guard_n']
        self.lru_evictions = 0
        self.valloc = 0                 # blocks allocated so far
        self.ahist = True
        self.avals, self.atimes = [], []
        self.tau_n, self.tau_s = 0.0, 0.0   # decayed reuse events, sum of their ages (s)

    def depth_levels(self):
        for tok in self.spec:
            if tok.startswith('depth'):
                return int(tok[5:])
        return 1

    def class_id(self, c):
        i = self.cid.get(c)
        if i is None:
            i = self.cid[c] = len(self.cnames)
            self.cnames.append(c)
            self.X.append([0.0] * self.J)
            self.E.append([0.0] * self.J)
            self.G.append(None)
            if self.mode == 'seg':
                self.segs.append(OrderedDict())
        return i

    def classify(self, depth, shared, nf, gap):
        """Feature class of a chain end released now.  gap: its last turn gap in H units."""
        S = self.spec
        D = self.depth_levels()
        if depth == 0:
            if shared and 'shared' in S:
                c = ('s',)
            else:
                c = ('d', 0)
            if 'size' in S and c == ('d', 0):
                c = ('d', 0, 'z', min(int(math.log2(max(1, nf))), 7))
            if 'size2' in S and c == ('d', 0):
                c = ('d', 0, 'z', min(int(2.0 * math.log2(max(1, nf))), 15))
            return self.class_id(c)
        c = ('d', min(depth, D - 1))
        if 'dsize' in S:
            c = c + ('z', min(int(2.0 * math.log2(max(1, nf))), 15))
        if ('gap' in S or 'gapm' in S) and gap is not None:
            c = c + ('g', 0 if gap < 0.5 else 1 if gap < 2.0 else 2)
        if 'gap2' in S and gap is not None:
            c = c + ('g', max(-3, min(3, int(math.floor(math.log2(max(gap, 1e-6)))))))
        return self.class_id(c)

    def horizon(self, now):
        if self.p['horizon'] == 'turnover':
            # the time the cache took to allocate its last `capacity` blocks
            v = self.valloc - self.eng.cap
            if v <= 0 or not self.ahist:
                return max(1e-3, now - self.t0) if self.t0 is not None else 1.0
            j = bisect.bisect_left(self.avals, v)
            return max(1e-3, now - self.atimes[min(j, len(self.atimes) - 1)])
        if self.H is not None:
            return self.H
        return max(1e-3, now - self.t0) if self.t0 is not None else 1.0

    # ---- statistics -------------------------------------------------------------------
    def bin_of(self, a):                # a in H units
        ed = self.edges
        lo, hi = 0, self.J - 1
        while lo < hi:
            m = (lo + hi + 1) >> 1
            if ed[m] <= a:
                lo = m
            else:
                hi = m - 1
        return lo

    def advance(self, now):
        """Credits E for each pending record whose age crossed a bin's lower edge."""
        H = self.horizon(now)
        order = self.order
        n = len(order)
        for j in range(self.J):
            lim = now - H * self.edges[j]
            c = self.cursor[j]
            while c < n and order[c][1] <= lim:
                r = order[c]
                if r[3] is None:            # still pending
                    self.E[r[0]][j] += 1.0
                c += 1
            self.cursor[j] = c

    def decay(self):
        g = self.gamma
        for c in range(len(self.cnames)):
            X, E = self.X[c], self.E[c]
            for j in range(self.J):
                X[j] *= g
                E[j] *= g

    def event(self, r, t, w):
        age = (t - r[1]) / self.horizon(t)
        r[3] = age
        self.X[r[0]][self.bin_of(age)] += w
        self.tau_n = self.tau_n * self.gamma + w
        self.tau_s = self.tau_s * self.gamma + w * (t - r[1])

    def odds_shift(self, c, t):
        """tau * logit(p_c): p_c = P(reused before the last age bin), tau = mean reuse age."""
        if not self.tau_n:
            return 0.0
        tau = self.tau_s / self.tau_n
        p = min(0.99, max(0.01, self.preuse[c]))
        return tau * math.log(p / (1.0 - p))

    def curves(self):
        np = self.np
        P = self.p
        ed, J, x = self.edges, self.J, self.xg
        Xa = np.array(self.X)
        Ea = np.array(self.E)
        n0 = P['prior_n']
        pool = (Xa.sum(axis=0) + P['prior_h']) / (Ea.sum(axis=0) + 1.0)
        # two-level shrinkage: a sub-class (e.g. a size band of fresh prompts) toward its
        # parent class (all fresh prompts), the parent toward the pool of all classes
        groups = {}
        for c, name in enumerate(self.cnames):
            groups.setdefault(name[:2], []).append(c)
        gh = {}
        for g, members in groups.items():
            gx = Xa[members].sum(axis=0)
            ge = Ea[members].sum(axis=0)
            gh[g] = (gx + n0 * pool) / (ge + n0) if P['hier'] else pool
        # fraction of each bin's cumulative hazard reached at each grid age
        if not hasattr(self, 'F'):
            F = np.zeros((J, len(x)))
            for j in range(J):
                lo = ed[j]
                hi = ed[j + 1] if j + 1 < J else None
                if hi is None:
                    F[j] = np.where(x > lo, np.log2(np.maximum(x, lo) / lo), 0.0) * \
                        P['bins_per_oct']
                elif lo == 0.0:
                    F[j] = np.clip(x / hi, 0.0, 1.0)
                else:
                    F[j] = np.clip(np.log(np.maximum(x, lo) / lo) / math.log(hi / lo), 0, 1)
            self.F = F
        dx = np.diff(x)
        self.preuse = [0.0] * len(self.cnames)
        for c in range(len(self.cnames)):
            hz = np.minimum(0.999, (Xa[c] + n0 * gh[self.cnames[c][:2]]) / (Ea[c] + n0))
            L = (-np.log1p(-hz)) @ self.F
            S = np.exp(-L)
            I = np.concatenate([[0.0], np.cumsum(0.5 * (S[1:] + S[:-1]) * dx)])
            num = S[:, None] - S[None, :]
            den = I[None, :] - I[:, None]
            with np.errstate(divide='ignore', invalid='ignore'):
                r = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
            row = r.max(axis=1)
            row[-1] = row[-2]
            self.G[c] = np.maximum(np.minimum.accumulate(row) if P['mono'] else row, 1e-9)
            self.preuse[c] = 1.0 - S[self.iend]
        self.logG = [np.log(g) for g in self.G]

    def density(self, c, a):
        """log G_c at age a (H units), the grid point at or below a."""
        x = self.xg
        if a <= 0.0:
            return self.logG[c][0]
        g = int(self.np.searchsorted(x, a, side='right')) - 1
        return self.logG[c][min(g, len(x) - 1)]

    def deadline(self, c):
        """A_c in H units: the first grid age where log G_c < mu."""
        if self.mu is None:
            return 0.0
        lg = self.logG[c]
        if lg[0] < self.mu:
            return 0.0
        # lg is nonincreasing: first index with lg < mu
        k = int(self.np.searchsorted(-lg, -self.mu, side='right'))
        return self.xg[min(k, len(self.xg) - 1)]

    # ---- cache events -------------------------------------------------------------------
    def shadow_step(self, h, nf, k):
        """The guard: an exact LRU leaf-first replay on hashes only (metadata, no KV); the
        decayed difference of hits says whether the value order currently beats LRU."""
        sh = self.shadow
        ks = 0
        while ks < nf and h[ks] in sh:
            ks += 1
        for j in range(ks):
            del sh[h[j]]
        lim = self.eng.cap - len(h)
        while len(sh) > lim:
            sh.popitem(last=False)
        for j in range(nf - 1, -1, -1):
            sh[h[j]] = None
        self.duel = self.duel * self.gamma_g + (k - ks)

    def opened(self, i, t, h, nf, k):
        if self.t0 is None:
            self.t0 = t
        self.advance(t)
        if self.p['guard'] and len(h) <= self.eng.cap:
            self.shadow_step(h, nf, k)
        src = None
        depth, gap, shared = 0, None, k > 0
        glog = None
        if self.p['ckpt']:
            cp = self.cp
            for j in range(nf - 1, -1, -1):
                r = cp.get(h[j])
                if r is None:
                    continue
                if j == r[4] - 1:           # the prompt extends (or repeats) r's chain
                    src = r
                    shared = False
                else:                       # it shares the first j+1 blocks of r's chain
                    depth = r[2]
                    shared = True
                    if r[3] is None and self.p['partial']:
                        self.event(r, t, (j + 1) / r[4])
                break
        else:
            recs = self.recs
            for j in range(nf - 1, -1, -1):
                r = recs.get(h[j])
                if r is not None:
                    src = r
                    shared = False
                    break
            if src is None and k and self.p['partial']:
                o = self.owner.get(h[k - 1])
                if o is not None and o[3] is None:
                    self.event(o, t, min(1.0, k / o[4]))
        if src is not None:
            depth = src[2] + 1
            gap = (t - src[1]) / self.horizon(t)
            lg = math.log(max(1e-3, t - src[1]))
            glog = lg if src[6] is None else 0.5 * (src[6] + lg)
            if 'gapm' in self.spec:         # the mean (log) gap of the turns so far
                gap = math.exp(glog) / self.horizon(t)
            if src[3] is None:
                self.event(src, t, 1.0)
        self.cur = (depth, shared, gap)
        self.cur_glog = glog
        self.nreq += 1
        if self.G[0] is None if self.G else True:
            pass
        if self.nreq % self.p['refresh'] == 1 or self.G and self.G[-1] is None:
            self.curves()

    def closing(self, i, t, h, nf, k):
        self.valloc += len(h) - k
        self.avals.append(self.valloc)
        self.atimes.append(t)
        depth, shared, gap = self.cur
        self.cur_cls = self.classify(depth, shared, nf, gap)
        if self.G[self.cur_cls] is None:
            self.curves()
        if self.mode == 'deadline':
            self.cur_key = t + self.horizon(t) * self.deadline(self.cur_cls)
        elif self.mode == 'odds':
            self.cur_key = t + self.odds_shift(self.cur_cls, t)

    def key(self, b, i, t, j):
        return self.cur_key

    def insert(self, b, i, t, j, maxchild):
        self.seq += 1
        self.info[b] = (self.cur_cls, t, self.seq)
        if self.mode != 'seg':
            return Policy.insert(self, b, i, t, j, maxchild)
        # rank of a class: its density at age 0; a block goes to its child's class when that
        # ranks higher (the parent keeps up with its most valuable cached child)
        s = self.cur_cls
        key = (float(self.logG[s][0]), s)
        if maxchild is not None and maxchild > key:
            key = maxchild
            s = key[1]
        self.segs[s][b] = None
        self.seg_of[b] = s
        return key

    def remove(self, b):
        self.owner.pop(b, None)
        if self.mode != 'seg':
            Policy.remove(self, b)
        else:
            s = self.seg_of.pop(b)
            del self.segs[s][b]

    def victim(self, now):
        if self.mode != 'seg':
            return Policy.victim(self, now)
        H = self.horizon(now)
        eng = self.eng
        ncc = eng.ncc
        if self.p['guard'] and self.duel < 0.0:
            # LRU is ahead: evict in LRU order (the oldest release among the heads is the
            # oldest cached block, a leaf)
            best = None
            for s in range(len(self.segs)):
                seg = self.segs[s]
                if seg:
                    b = next(iter(seg))
                    key = self.info[b][2]
                    if best is None or key < best[0]:
                        best = (key, b)
            self.lru_evictions += 1
            return best[1]
        for attempt in range(self.p['relocate'] + 1):
            cand = []
            for s in range(len(self.segs)):
                seg = self.segs[s]
                if not seg:
                    continue
                b = next(iter(seg))
                v = self.density(s, (now - self.info[b][1]) / H)
                cand.append((v, s, b))
            cand.sort()
            v, s, b = cand[0]
            if not ncc.get(b, 0):
                return b
            if attempt == self.p['relocate']:
                break
            # The cheapest head still has cached children (its class's curve fell below a
            # child's): it goes to the tail of its segment, keeping its release time, and the
            # choice is made again.  Its children go first; then it comes back as an old,
            # cheap head.
            seg = self.segs[s]
            seg.move_to_end(b)
            self.relocations += 1
        for v, s, b in cand:
            if not ncc.get(b, 0):
                self.fallbacks += 1
                return b
        raise AssertionError('no leaf among the heads')

    def evicted(self, b, now):
        c, t, _ = self.info.pop(b)
        age = now - t
        cap = self.eng.cap
        if self.H is None:
            self.H = max(age, 1e-3)
        else:
            self.H += (age - self.H) / cap
        lg = self.density(c, age / self.horizon(now))
        if self.mu is None:
            self.mu = lg
        else:
            self.mu += (lg - self.mu) / (cap * self.p['mu_turns'])

    def closed(self, i, t, h, nf, k):
        if not nf:
            return
        self.decay()
        e = h[nf - 1]
        depth, shared, gap = self.cur
        r = [self.cur_cls, t, depth, None, nf, None, self.cur_glog]
        if self.p['ckpt']:
            # checkpoints: the blocks at n-1, n-2, n-4, n-8, ... of the chain
            cps = []
            m = 1
            while nf - m >= 0:
                x = h[nf - m]
                self.cp[x] = r
                cps.append(x)
                m <<= 1
            r[5] = cps
            self.rq.append(r)
            self.order.append(r)
            while len(self.rq) > self.rec_max:
                r0 = self.rq.popleft()
                for x in r0[5]:
                    if self.cp.get(x) is r0:
                        del self.cp[x]
                if r0[3] is None:
                    r0[3] = -1.0            # forgotten: no longer pending
            return
        if self.p['partial']:
            for x in h[:nf]:
                self.owner[x] = r
        old = self.recs.pop(e, None)
        if old is not None and old[3] is None:
            old[3] = -1.0                   # superseded: no longer pending
        self.recs[e] = r
        self.order.append(r)
        while len(self.recs) > self.rec_max:
            _, r0 = self.recs.popitem(last=False)
            if r0[3] is None:
                r0[3] = -1.0                # forgotten: no longer pending

    def debug(self):
        print('  H=%.1f s  mu=%s  classes=%d' % (self.H or 0, self.mu, len(self.cnames)))
        for c in range(len(self.cnames)):
            hz = ['%.3f' % (self.X[c][j] / self.E[c][j]) if self.E[c][j] else '-'
                  for j in range(self.J)]
            print('  ', self.cnames[c], 'E', ['%.0f' % x for x in self.E[c]], 'h', hz)
            print('     logG', ['%.2f' % self.logG[c][g] for g in range(0, len(self.xg), 8)],
                  'A=%.2f' % self.deadline(c))


# The chosen model ('value'); see REPORT.md for why each value.
DEFAULTS = dict(
    mode='seg',                 # one FIFO segment per class, evict the head with the lowest G
    classes='depth4+size2+gap', # turn depth 0,1,2,3+; fresh prompts by size (half octaves);
                                # deeper ones by their last turn gap (< H/2, < 2H, more)
    partial=True,               # a prompt sharing a prefix of an earlier chain is a reuse of it
    ckpt=True,                  # records keep checkpoints (blocks n-1, n-2, n-4, ...)
    hier=True,                  # size/gap classes shrink toward their depth class
    prior_n=4.0,                # shrinkage weight (pseudo-records per age bin)
    prior_h=0.05,               # hazard of the pool before any data
    rec_mult=1.0,               # records kept: capacity x this (FIFO)
    decay_n=1000,               # statistics decay by 1 - 1/decay_n per closed request
    bins_per_oct=1, oct_below=3, oct_above=4,  # age bins: 0, H/8, H/4, ... 16H, open
    refresh=16,                 # curves recomputed every 16 requests
    horizon='evict',            # H: decayed mean age of evicted blocks ('turnover': time to
                                # allocate `capacity` blocks)
    mono=True,                  # G made nonincreasing in age
    relocate=0,                 # blocked cheapest head: 0 = take the next head (see REPORT)
    guard=False,                # shadow LRU (hashes only); evict in LRU order while it leads
    guard_n=1000,               # the lead is decayed by 1 - 1/guard_n per request
    mu_turns=1.0,               # 'deadline' mode only
)

# Named variants for the table.
VARIANTS = {
    'value': {},
    'value-guard': dict(guard=True),
    'value-depth': dict(classes='depth4'),
    'value-size': dict(classes='depth4+size2'),
    'value-nockpt': dict(ckpt=False),
    'value-deadline': dict(mode='deadline'),
    'value-odds': dict(mode='odds'),
}


def make_policy(name, reqs, **kw):
    if name == 'lru':
        return LRU()
    if name == 'belady':
        return Belady(reqs)
    if name == 'oracle':
        return OracleExt(reqs)
    if name in VARIANTS:
        return Value(**dict(VARIANTS[name], **kw))
    raise SystemExit('unknown policy ' + name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--policy', default='lru')
    ap.add_argument('--capacity', default='5000,10000')
    ap.add_argument('--trace', default=TRACE)
    ap.add_argument('--json', action='store_true')
    ap.add_argument('--set', action='append', default=[],
                    help='policy parameter, e.g. --set nclass=3 (value policies)')
    ap.add_argument('--debug', action='store_true')
    ap.add_argument('--cold', action='store_true',
                    help='also run the second half alone from an empty cache')
    a = ap.parse_args()
    reqs = load(a.trace)
    out = []
    print('%-14s %8s %8s %8s %8s %8s %9s %5s' % ('policy', 'capacity', 'whole', 'first',
                                                  'second', 'cold2nd', 'evicted', 'viol'))
    for pol in a.policy.split(','):
        for cap in [int(x) for x in a.capacity.split(',')]:
            kw = {}
            for kv in a.set:
                kk, vv = kv.split('=')
                kw[kk] = type(DEFAULTS[kk])(vv) if not isinstance(DEFAULTS[kk], bool) \
                    else vv in ('1', 'true', 'True')
            p = make_policy(pol, reqs, **kw)
            r = Engine(reqs, cap, p).run().result()
            if a.debug and hasattr(p, 'debug'):
                p.debug()
            r['cold2nd'] = None
            if a.cold:
                e2 = Engine(reqs, cap, make_policy(pol, reqs, **kw)).run(1997, len(reqs))
                r['cold2nd'] = e2.result()['second']
            r.update(policy=pol, capacity=cap)
            out.append(r)
            print('%-14s %8d %8.4f %8.4f %8.4f %8s %9d %5d' % (
                pol, cap, r['whole'], r['first'], r['second'],
                '-' if r['cold2nd'] is None else '%.4f' % r['cold2nd'], r['evictions'],
                r['violations']), flush=True)
    if a.json:
        json.dump(out, sys.stdout, indent=1)


if __name__ == '__main__':
    main()
