"""The scale bench's DCP generator (e2e/bench/gen_scale.py) writes the
.metadata pickle stream by hand, tensor by tensor; it must be the bytes
pickle.dumps writes for torch's own Metadata objects built the slow way
(gen_scale.build), at sizes that reach each of the pickler's rules:
frames, batches of 1000 in lists and dicts (a dict whose last batch is full,
a list whose last batch holds one item), LONG_BINGET, ints of every width,
Adam's scalars and bytes item, and the empty chunks past a tensor's last
row whose storage entries collapse into one."""

import argparse
import io
import os
import pickle
import shutil
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "e2e" / "bench"))
import gen_scale  # noqa: E402
import gencache  # noqa: E402

LLAMA_405B = dict(hidden=16384, ffn=53248, kv_heads=8, head_dim=128, vocab=128256)
SMALL = dict(hidden=64, ffn=128, kv_heads=2, head_dim=4, vocab=300)

CASES = {
    "w8": dict(ranks=8, layers=2, **LLAMA_405B),
    "w8-adam": dict(ranks=8, layers=2, adam=True, **LLAMA_405B),
    "w64": dict(ranks=64, layers=2, **LLAMA_405B),
    "w64-adam": dict(ranks=64, layers=2, adam=True, **LLAMA_405B),
    # lists of 1001 chunks (a last batch of one); k/v have 1024 rows, so
    # ranks 512 and up hold empty chunks
    "w1001": dict(ranks=1001, layers=1, **LLAMA_405B),
    # storage_data of exactly 6000 entries: the C pickler's empty last batch
    "dict-of-6000": dict(ranks=8, layers=83, **SMALL),
    # state_dict_metadata of 1011 items
    "items-1011": dict(ranks=2, layers=112, **SMALL),
}


def args(ranks, layers, adam=False, **shape):
    return argparse.Namespace(ranks=ranks, layers=layers, adam=adam, **shape)


@pytest.mark.parametrize("name", CASES)
def test_fast_metadata_is_torchs_pickle(name):
    a = args(**CASES[name])
    md, sizes = gen_scale.build(a)
    want = pickle.dumps(md)
    f = io.BytesIO()
    got_sizes = gen_scale.write_fast(a, f)
    got = f.getvalue()
    if got != want:
        at = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
        pytest.fail(f"{name}: {len(got)} bytes, torch's pickle {len(want)}; first difference at {at}: "
                    f"{got[at - 16:at + 16]!r} vs {want[at - 16:at + 16]!r}")
    assert got_sizes == sizes
    if name == "dict-of-6000":
        assert len(md.storage_data) == 6000
    if name == "items-1011":
        assert len(md.state_dict_metadata) == 1011
    if name == "w1001":
        assert len(md.storage_data) < sum(len(t.chunks) for t in md.state_dict_metadata.values())


# gencache: the one owner of the bench's generate-once.
GEN = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import helper
out = sys.argv[1]
with open(os.environ["RUNS"], "a") as f:
    f.write(" ".join(sys.argv[2:]) + "\\n")
os.makedirs(out)
with open(os.path.join(out, "data"), "w") as f:
    f.write(helper.VALUE + " " + " ".join(sys.argv[2:]))
print("generated", out)  # to stderr: a bench's stdout is its results
if "--die" in sys.argv:
    os.kill(os.getpid(), 9)  # killed mid-write: a half checkpoint in the temporary
"""


@pytest.fixture
def gens(tmp_path, monkeypatch):
    """A generator (gen.py importing helper.py) in a directory of its own,
    gencache pointed at it; returns (gen, runs, src dir, write(file, text))."""
    d = tmp_path / "gens"
    d.mkdir()
    (d / "gen.py").write_text(GEN)
    (d / "helper.py").write_text('VALUE = "one"\n')
    monkeypatch.setattr(gencache, "HERE", str(d))
    monkeypatch.setattr(gencache, "SEARCH", (str(d),))
    runs = tmp_path / "runs"
    runs.write_text("")
    work = tmp_path / "work"

    def gen(*args):
        return gencache.gen(str(work), "ck", "gen.py", *args, env={"RUNS": str(runs)})

    return gen, lambda: runs.read_text().splitlines(), work / "src", lambda f, t: (d / f).write_text(t)


def test_gencache_generates_once(gens, capfd):
    gen, runs, src, _ = gens
    a = gen("--n", 1)
    out, err = capfd.readouterr()
    assert out == "" and "generated" in err, "the generator wrote to the bench's stdout"
    assert a == str(src / "ck"), "sections find a checkpoint at WORK/src/NAME"
    assert open(os.path.join(a, "data")).read() == "one --n 1"
    assert gen("--n", 1) == a and runs() == ["--n 1"]
    m = gencache.made(a)
    assert m["args"] == ["--n", "1"] and m["script"] == "gen.py"
    assert m["wall_s"] >= 0 and m["cpu_s"] >= 0 and m["peak_MiB"] > 0
    assert sorted(os.listdir(src)) == ["ck", "ck.json"]


def stale_copies(src):
    """What bench_scale's copies() keeps beside a checkpoint."""
    os.makedirs(src / "ck.x3" / "c0")
    (src / "ck.x3.done").write_text("")


def test_gencache_argument_change_regenerates(gens):
    gen, runs, src, _ = gens
    a = gen("--n", 1)
    k = gencache.made(a)["key"]
    stale_copies(src)
    b = gen("--n", 2)
    assert b == a and runs() == ["--n 1", "--n 2"] and gencache.made(b)["key"] != k
    assert open(os.path.join(b, "data")).read() == "one --n 2"
    assert sorted(os.listdir(src)) == ["ck", "ck.json"], "copies of the replaced checkpoint are kept"


def test_gencache_comment_or_docstring_change_reuses(gens):
    gen, runs, src, write = gens
    a = gen("--n", 1)
    write("gen.py", '"""A generator."""\n' + GEN + "# a comment\n")
    write("helper.py", '"""Its helper."""\nVALUE = "one"  # the value\n')
    assert gen("--n", 1) == a and len(runs()) == 1


@pytest.mark.parametrize("changed", ["gen.py", "helper.py"])
def test_gencache_source_change_regenerates(gens, changed):
    gen, runs, src, write = gens
    a = gen("--n", 1)
    stale_copies(src)
    if changed == "helper.py":  # a module the generator imports
        write("helper.py", 'VALUE = "two"\n')
    else:
        write("gen.py", GEN + "CHANGED = 1\n")
    b = gen("--n", 1)
    assert b == a and len(runs()) == 2
    assert open(os.path.join(b, "data")).read() == ("two" if changed == "helper.py" else "one") + " --n 1"
    assert sorted(os.listdir(src)) == ["ck", "ck.json"]


def test_gencache_interrupted_generation_is_never_reused(gens):
    gen, runs, src, _ = gens
    with pytest.raises(RuntimeError, match="generation failed"):
        gen("--die")
    assert os.listdir(src) == [], "a killed generation left something behind"
    # A bench killed itself mid-generation (its temporary left), or between
    # the rename and the stamp (a checkpoint without its stamp): neither is
    # reused, both are removed.
    a = gen("--n", 1)
    os.remove(a + ".json")
    os.makedirs(a + ".tmp-99999")
    b = gen("--n", 1)
    assert b == a and runs() == ["--die", "--n 1", "--n 1"]
    assert sorted(os.listdir(src)) == ["ck", "ck.json"]
    shutil.rmtree(a)  # a stamp whose checkpoint is gone
    assert gen("--n", 1) == a and len(runs()) == 4 and os.path.exists(os.path.join(a, "data"))


def test_gencache_replaces_the_older_layouts(gens):
    gen, runs, src, _ = gens
    os.makedirs(src / "ck")  # bench.gen's: NAME and NAME.done
    (src / "ck.done").write_text('["gen.py"]')
    os.makedirs(src / "ck-0123456789ab.x3")  # bench_scale.gen's: NAME-KEY, its stamp and copies
    (src / "ck-0123456789ab.done").write_text("{}")
    os.makedirs(src / "ck-other")  # not a kept checkpoint of ck: left
    a = gen()
    assert runs() == [""] and os.path.exists(os.path.join(a, "data"))
    assert sorted(os.listdir(src)) == ["ck", "ck-other", "ck.json"]


def test_gencache_keys_the_bench_generators_sources():
    """The real generators' keys cover the modules they import: a change to
    gen_scale.py regenerates the checkpoints of every generator built on it."""
    def names(script):
        return sorted(os.path.relpath(p, ROOT / "e2e") for p in gencache.sources(script))

    assert names("gen_scale_dcpsave.py") == ["bench/gen_scale.py", "bench/gen_scale_bytes.py",
                                             "bench/gen_scale_dcpsave.py"]
    assert names("gen_llama.py") == ["bench/gen_llama.py", "models.py"]
    assert names("gen_scale.py") == ["bench/gen_scale.py"]
