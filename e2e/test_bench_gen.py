"""The scale bench's DCP generator (e2e/bench/gen_scale.py) writes the
.metadata pickle stream by hand, tensor by tensor. It must be the bytes
dcp.save writes: torch's own dcp.save of the same model by threaded ranks
(gen_scale_dcpsave.py, the oracle) at sizes it reaches in seconds, with
and without Adam's state (empty chunks, de-duplicated steps, the lr bytes
item, frames, a batch of 1000). Where dcp.save cannot go here (a list of
1001 chunks, a dict whose last batch is full, 1011 items), the stream must
be pickle.dumps of torch's objects built with the same objects shared
(gen_scale.build), which the oracle's cases check too."""

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
    # ranks 512 and up hold (one, de-duplicated) empty chunk
    "w1001": dict(ranks=1001, layers=1, **LLAMA_405B),
    # storage_data of exactly 6000 entries: the C pickler's empty last batch
    "dict-of-6000": dict(ranks=8, layers=83, **SMALL),
    # state_dict_metadata of 1011 items
    "items-1011": dict(ranks=2, layers=112, **SMALL),
    # one rank: every item and the lr (its first record) on rank 0, every
    # planner_data key the one string of state_dict_metadata's
    "w1-adam": dict(ranks=1, layers=1, adam=True, **SMALL),
}

# dcp.save itself, by threaded ranks: W = 6 of small dims (k/v of 8 rows:
# ranks 4 and 5 hold empty chunks) and W = 16 of the 405B shapes (frames,
# storage_data past 1000 entries), both with Adam; without Adam is the
# model part of the same stream (checked by hand at W = 4, 6, 8, 16).
DCPSAVE = {
    "w6-adam-small": dict(ranks=6, layers=1, adam=True, **SMALL),
    "w16-adam": dict(ranks=16, layers=2, adam=True, **LLAMA_405B),
}


def args(ranks, layers, adam=False, checkpoint_id="/ckpt/step-1000", save_id="0f1e2d3c", **shape):
    return argparse.Namespace(ranks=ranks, layers=layers, adam=adam, checkpoint_id=checkpoint_id, save_id=save_id,
                              **shape)


def first_difference(name, got, want):
    """The first opcode that differs (a frame's length differs whenever
    anything in it does, so bytes alone would point at the frame)."""
    import pickletools

    ops = zip(pickletools.genops(got), pickletools.genops(want))
    for (o1, a1, p1), (o2, a2, p2) in ops:
        if o1.name != o2.name or (a1 != a2 and o1.name != "FRAME"):
            return (f"{name}: {len(got)} bytes, the oracle's {len(want)}; first difference: "
                    f"{o1.name} {a1!r} at {p1} vs {o2.name} {a2!r} at {p2}")
    return f"{name}: {len(got)} bytes, the oracle's {len(want)}; one ends first"


@pytest.mark.parametrize("name", DCPSAVE)
def test_metadata_is_what_dcp_save_writes(name, tmp_path):
    import gen_scale_dcpsave

    c = DCPSAVE[name]
    out = str(tmp_path / "dcp")
    gen_scale_dcpsave.save(out, args(**c))
    with open(os.path.join(out, ".metadata"), "rb") as f:
        want = f.read()
    md = pickle.loads(want)
    a = args(**c, checkpoint_id=str(md.storage_meta.checkpoint_id), save_id=md.storage_meta.save_id)
    f = io.BytesIO()
    sizes = gen_scale.write_fast(a, f)
    got = f.getvalue()
    if got != want:
        pytest.fail(first_difference(name, got, want))
    assert sizes == [os.path.getsize(os.path.join(out, f"__{r}_0.distcp")) for r in range(a.ranks)]
    built, built_sizes = gen_scale.build(a)
    assert pickle.dumps(built) == want and built_sizes == sizes
    # what the old stream lacked is there
    assert md.version == "1.0.0" and len(want) > 1000
    if name == "w6-adam-small":
        k = md.state_dict_metadata["model.model.layers.0.self_attn.k_proj.weight"]
        assert [tuple(x.sizes)[0] for x in k.chunks] == [2, 2, 2, 2, 0], "one empty chunk of ranks 4 and 5"
        ranks = [int(v.relative_path.split("_")[2]) for v in md.storage_data.values()]
        assert ranks == sorted(ranks) and len(set(ranks)) == 6, "storage_data rank by rank"


@pytest.mark.parametrize("name", CASES)
def test_fast_metadata_is_torchs_pickle(name):
    a = args(**CASES[name])
    md, sizes = gen_scale.build(a)
    want = pickle.dumps(md)
    f = io.BytesIO()
    got_sizes = gen_scale.write_fast(a, f)
    got = f.getvalue()
    if got != want:
        pytest.fail(first_difference(name, got, want))
    assert got_sizes == sizes
    if name == "dict-of-6000":
        assert len(md.storage_data) == 6000
    if name == "items-1011":
        assert len(md.state_dict_metadata) == 1011
    if name == "w1001":
        chunks = md.state_dict_metadata["model.model.layers.0.self_attn.k_proj.weight"].chunks
        assert len(chunks) == 513 and tuple(chunks[-1].sizes) == (0, 16384)
        assert len(md.storage_data) == sum(len(t.chunks) for t in md.state_dict_metadata.values())


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
