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
import pickle
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "e2e" / "bench"))
import gen_scale  # noqa: E402

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
