#!/usr/bin/python3
"""Parameter sweeps on a part of the trace: sweep.py first|second|whole 'k=v,k=v' ['k=v' ...]"""
import sys
from sim import load, Engine, make_policy, DEFAULTS
reqs = load()
part = sys.argv[1]
lo, hi = {'first': (0, 1997), 'second': (1997, len(reqs)), 'whole': (0, len(reqs))}[part]
caps = [1000, 2000, 5000, 10000, 20000]
def conv(k, v):
    d = DEFAULTS[k]
    if isinstance(d, bool): return v in ('1', 'true')
    return type(d)(v)
base = {c: Engine(reqs, c, make_policy('lru', reqs)).run(lo, hi) for c in caps}
def frac(e): return sum(e.hits) / max(1, sum(e.blocks))
print('%-40s' % 'lru', ' '.join('%7.4f' % frac(base[c]) for c in caps))
for spec in sys.argv[2:]:
    kw = dict((kv.split('=')[0], conv(*kv.split('='))) for kv in spec.split(',') if kv)
    row = []
    for c in caps:
        e = Engine(reqs, c, make_policy('value', reqs, **kw)).run(lo, hi)
        row.append(frac(e) - frac(base[c]))
    print('%-40s' % (spec or 'default'), ' '.join('%+7.4f' % x for x in row), ' sum %+.4f' % sum(row), flush=True)
