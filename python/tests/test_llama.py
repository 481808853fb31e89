# SPDX-License-Identifier: MIT
"""python/examples/llama.py, stories260K on NumPy through the binding, against the real daemon
and the C engine (kvpaged-llama, beside $KVPAGED_BIN): the published outputs, and logits bitwise
equal to its own --contiguous mode and to the C engine's, with either engine's prefixes."""
import json
import os
import subprocess
import sys
import time

import pytest

import kvpaged
from conftest import start, stop

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "llama.py")
DATA = os.path.join(HERE, "..", "..", "data", "stories260K")
SAMPLE = os.path.join(DATA, "tinystories_sample.txt")
LLAMA_C = os.path.join(os.path.dirname(os.environ["KVPAGED_BIN"]), "kvpaged-llama")
REFERENCE = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
             "the park. One day, she saw a big, red ball. She wanted to play with it, but it "
             "was too high.")
# 41 tokens with BOS: two full blocks and a partial one.
PROMPT = ("Once upon a time, there was a big tree in the forest. A little bird lived in the "
          "tree. One day, the bird")
ENGINE_POOL = ("layers = 5\nkv_heads = 4\nhead_dim = 8\nelement_bytes = 4\nblock_tokens = 16\n")


def run(cmd, d, timeout=300):
    """Runs an engine against daemon d; its last stdout line, parsed (JSON)."""
    env = dict(os.environ, KVPAGED_SOCKET=d.sock) if d else dict(os.environ)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr + p.stdout
    return json.loads(p.stdout.strip().splitlines()[-1])


def py(d, *args):
    return run([sys.executable, EXAMPLE, "--json"] + list(args), d)


def c(d, *args):
    return run([LLAMA_C, "--model", os.path.join(DATA, "stories260K.bin"), "--tokenizer",
                os.path.join(DATA, "tok512.bin"), "--json"] + list(args), d)


def same(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        x, y = f.read(), g.read()
    return len(x) > 0 and x == y


@pytest.fixture
def pool(tmp_path):
    d = start(tmp_path, ENGINE_POOL + "capacity_blocks = 4096\n")
    yield d
    stop(d)


def test_greedy_from_bos_is_the_reference(pool, tmp_path):
    for mode in (["--contiguous"], []):
        out = py(pool, "--steps", "64", "--dump-logits", str(tmp_path / "py"), *mode)
        assert out["texts"][0].startswith(REFERENCE), out
        assert (out["prompt_tokens"], out["generated"]) == (1, 64), out
        c(None, "--contiguous", "--steps", "64", "--dump-logits", str(tmp_path / "c"))
        assert same(tmp_path / "py", tmp_path / "c"), "logits differ from the C engine's"


def test_perplexity_cold_and_over_its_own_blocks(pool, tmp_path):
    ref = py(None, "--contiguous", "--perplexity", SAMPLE, "--dump-logits",
             str(tmp_path / "contiguous"))
    assert (ref["tokens"], ref["stories"]) == (1804, 5), ref
    assert abs(ref["nats_per_token"] - 1.2664) < 0.002, ref
    cold = py(pool, "--perplexity", SAMPLE, "--dump-logits", str(tmp_path / "cold"))
    assert cold["nats_per_token"] == ref["nats_per_token"] and cold["reused"] == 0, cold
    assert same(tmp_path / "contiguous", tmp_path / "cold")
    # Every story's full blocks come from the first run; each reused row is recomputed and
    # found equal to the pool's (5 layers a position).
    warm = py(pool, "--perplexity", SAMPLE, "--dump-logits", str(tmp_path / "warm"))
    assert warm["reused"] >= 1700 and warm["checked_rows"] == 5 * warm["reused"], warm
    assert same(tmp_path / "contiguous", tmp_path / "warm")
    # The C engine over the Python engine's blocks: the same K/V, row for row.
    cw = c(pool, "--perplexity", SAMPLE)
    assert cw["reused"] >= 1700 and cw["checked_rows"] == 5 * cw["reused"], cw
    assert cw["nats_per_token"] == ref["nats_per_token"], cw


def test_the_two_engines_reuse_each_others_prefixes(pool, tmp_path):
    t = str(tmp_path)
    py(None, "--contiguous", "--prompt", PROMPT, "--steps", "48", "--dump-logits", t + "/ref")
    # Python, cold: its own blocks; then over them.
    cold = py(pool, "--prompt", PROMPT, "--steps", "48", "--dump-logits", t + "/cold")
    assert cold["reused"] == 0 and same(t + "/ref", t + "/cold"), cold
    warm = py(pool, "--prompt", PROMPT, "--steps", "48", "--dump-logits", t + "/warm")
    assert (warm["reused"], warm["prefilled"]) == (32, 9), warm
    assert same(t + "/ref", t + "/warm") and warm["texts"] == cold["texts"]
    # Every way of talking to the daemon: steps over the rings that wait, socket calls (the
    # default defers steps that need no new block).
    for how in ("--no-defer", "--no-rings"):
        out = py(pool, how, "--prompt", PROMPT, "--steps", "48", "--dump-logits", t + "/how")
        assert out["reused"] == 32 and same(t + "/ref", t + "/how"), (how, out)
    # The C engine over the Python engine's blocks, and its logits are the same.
    cc = c(pool, "--prompt", PROMPT, "--steps", "48", "--dump-logits", t + "/c")
    assert cc["reused"] == 32 and same(t + "/ref", t + "/c"), cc
    # And the reverse, on a prompt the C engine commits first.
    other = ("Tom had a red kite. He liked to fly it in the park with his mom. One windy day, "
             "the kite")  # 39 tokens, none of PROMPT's blocks
    py(None, "--contiguous", "--prompt", other, "--steps", "40", "--dump-logits", t + "/ref2")
    first = c(pool, "--prompt", other, "--steps", "40", "--dump-logits", t + "/c2")
    assert first["reused"] == 0 and same(t + "/ref2", t + "/c2"), first
    second = py(pool, "--prompt", other, "--steps", "40", "--dump-logits", t + "/py2")
    assert second["reused"] == 32 and same(t + "/ref2", t + "/py2"), second
    # Generated blocks are committed too: a prompt running into them reuses them.
    more = py(pool, "--prompt", cold["texts"][0], "--steps", "4")
    assert more["reused"] > 32, more


def test_forks_share_blocks_until_copy_on_write(pool, tmp_path):
    t = str(tmp_path)
    fprompt = "Once upon a time, there was a little dog named Max. Max liked to run"
    forked = py(pool, "--prompt", fprompt, "--steps", "40", "--fork", "3", "--temperature",
                "0.9", "--seed", "11", "--dump-logits", t + "/fork")
    assert forked["continuations"] == 3, forked
    for i in range(3):
        py(None, "--contiguous", "--prompt", fprompt, "--steps", "40", "--temperature", "0.9",
           "--seed", str(11 + i), "--dump-logits", t + "/single.%d" % i)
        assert same(t + "/fork.%d" % i, t + "/single.%d" % i), "continuation %d" % i
    # The C engine forks the same way and samples the same tokens.
    c(pool, "--prompt", fprompt, "--steps", "40", "--fork", "3", "--temperature", "0.9",
      "--seed", "11", "--dump-logits", t + "/cfork")
    for i in range(3):
        assert same(t + "/fork.%d" % i, t + "/cfork.%d" % i), "C continuation %d" % i
    texts = forked["texts"]
    assert texts[0] != texts[1] and texts[1] != texts[2]
    stats = kvpaged.Admin(pool.admin).stats()["pools"][0]
    assert stats["cow_copies"] >= 2, stats


def park(d, tmp_path, name, park_at):
    """Starts the Python engine on PROMPT, returns once it has parked: (process, go file)."""
    go = tmp_path / (name + ".go")
    out = open(tmp_path / (name + ".out"), "w")
    p = subprocess.Popen([sys.executable, EXAMPLE, "--json", "--prompt", PROMPT, "--steps", "96",
                          "--park-at", str(park_at), "--park-wait", str(go), "--dump-logits",
                          str(tmp_path / name)], env=dict(os.environ, KVPAGED_SOCKET=d.sock),
                         stdout=out, stderr=subprocess.STDOUT, text=True)
    for _ in range(3000):
        if "parked:" in (tmp_path / (name + ".out")).read_text():
            return p, go
        assert p.poll() is None, (tmp_path / (name + ".out")).read_text()
        time.sleep(0.01)
    p.kill()
    raise AssertionError("%s did not park within 30 s" % name)


def finish(p, go, tmp_path, name):
    go.touch()
    assert p.wait(120) == 0, (tmp_path / (name + ".out")).read_text()
    out = json.loads((tmp_path / (name + ".out")).read_text().strip().splitlines()[-1])
    assert out["parked"] is True, out
    assert same(tmp_path / "contiguous", tmp_path / name), "%s: logits after resume" % name
    return out


def test_park_and_resume_kept_and_through_the_host_and_file_tiers(tmp_path):
    # Parked after 48 generated tokens, the sequence holds 89: five full blocks, committed,
    # and 9 tokens in a partial last block, which no tier keeps.
    py(None, "--contiguous", "--prompt", PROMPT, "--steps", "96", "--dump-logits",
       str(tmp_path / "contiguous"))
    kept = tmp_path / "daemon-kept"
    kept.mkdir()
    d = start(kept, ENGINE_POOL + "capacity_blocks = 4096\n")
    try:
        p, go = park(d, tmp_path, "kept", 48)
        assert finish(p, go, tmp_path, "kept")["resumed_recompute"] == 0
    finally:
        stop(d)
    # 16 blocks, a 2-block host tier and a file tier: the C engine's greedy run from BOS
    # needs all 16, the daemon preempts the parked sequence and swaps its five committed
    # blocks down the tiers; on resume they come back and only the partial tail is run again.
    swapped = tmp_path / "daemon-swapped"
    swapped.mkdir()
    d = start(swapped, ENGINE_POOL + "capacity_blocks = 16\nhost_tier_blocks = 2\n"
              "file_tier_blocks = 64\nswap_files = %s\n" % (swapped / "swap"))
    try:
        admin = kvpaged.Admin(d.admin)
        p, go = park(d, tmp_path, "A", 48)
        b = c(d, "--steps", "256")
        assert b["texts"][0].startswith(REFERENCE), b
        st = admin.stats()["pools"][0]
        tiers = {t["tier"]: t for t in st["tiers"]}
        assert (st["preemptions"], st["swaps"]) == (1, 1), st
        assert tiers["host"]["demotions"] >= 5 and tiers["file"]["demotions"] >= 3, tiers
        out = finish(p, go, tmp_path, "A")
        assert out["resumed_recompute"] == 89 % 16, out
        tiers = {t["tier"]: t for t in admin.stats()["pools"][0]["tiers"]}
        assert tiers["host"]["promotions"] + tiers["file"]["promotions"] >= 5, tiers
        assert tiers["file"]["promotions"] >= 3, tiers
        assert admin.verify()["ok"] is True
    finally:
        stop(d)
