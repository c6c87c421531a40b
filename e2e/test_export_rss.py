"""`ckptfs export` of a large DeepSpeed ZeRO checkpoint, or of a large
pytorch_model.bin, streams: its peak RSS stays far below the model's size
(a reader that gathered the fp32 partitions, or a torch.save storage, into
memory would use more than the model), and the output holds, byte for byte,
the tensors torch computes from the same files.

The large checkpoints are written in tmp by this file run as a script (in a
child interpreter, so that its gigabytes and its stand-in deepspeed classes
stay out of the test process): it loads the committed small fixture's files
with torch.load(weights_only=False), scales param_shapes and the flat fp32
partitions (and the ZeRO-2 module's weights, optimizer moments, slice
mappings) to a ~108M-parameter Llama, and torch.saves the same dicts.
deepspeed is not installed in e2e/.venv: the classes the pickles name
(LossScaler, ZeroStageEnum, fragment_address) load as stand-ins that pickle
again under the same names, the same way. That rebuilding the small
fixture with its own tensors gives back files that export byte-equal to the
fixture's is checked first.
"""

import copyreg
import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys
import types
from collections import OrderedDict

import pytest

from conftest import TESTDATA
from test_hostile import run

MiB = 1 << 20
WORLD = 2
# The small fixtures' dimensions (vocab 120, hidden 48, intermediate 96,
# kv 2 x head_dim 12), scaled to vocab 8000, hidden 2048, intermediate 4096,
# kv 1024: 108,275,712 fp32 parameters, 433 MB.
BIG = {120: 8000, 48: 2048, 96: 4096, 24: 1024}
MODEL_BYTES = 108_275_712 * 4
# Peak RSS allowed for exporting it: well under half of the model.
RSS_LIMIT_MIB = 200


# ---------------------------------------------------------------- the writer
# (runs in a child interpreter: python e2e/test_export_rss.py ...)

class _Stub:
    """A deepspeed class the pickle names: rebuilt as it was pickled (NEWOBJ
    + BUILD of its __dict__, or a call with arguments for an enum) and
    pickled back the same way under the same module and name."""

    def __init__(self, *args):
        self.__dict__["_args"] = args

    def __reduce_ex__(self, proto):
        if "_args" in self.__dict__:
            return type(self), self._args
        return copyreg.__newobj__, (type(self),), (dict(self.__dict__) or None)

    def __eq__(self, other):
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __repr__(self):
        return f"{type(self).__qualname__}({self.__dict__})"


def _stub_class(module, name):
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        mod = ".".join(parts[:i])
        if mod not in sys.modules:
            sys.modules[mod] = types.ModuleType(mod)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[mod])
    m = sys.modules[module]
    if not hasattr(m, name):
        setattr(m, name, type(name, (_Stub,), {"__module__": module, "__qualname__": name}))
    return getattr(m, name)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return _stub_class(module, name)


_PICKLE = types.SimpleNamespace(Unpickler=_Unpickler, Pickler=pickle.Pickler, load=pickle.load,
                                dump=pickle.dump, __name__="pickle")


def _load(path, mmap=False):
    import torch
    return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_PICKLE, mmap=mmap)


def _new(cls, **fields):
    obj = cls.__new__(cls)
    obj.__dict__.update(fields)
    return obj


def _like(old, new):
    """new, with old's requires_grad and Python attributes (ZeRO-3's flat
    group carries a ds_id, pickled with it)."""
    new.requires_grad_(old.requires_grad)
    new.__dict__.update(old.__dict__)
    return new


def _model_states(stage):
    if stage == 2:
        return ["mp_rank_00_model_states.pt"]
    return [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(WORLD)]


def _optim(r):
    return f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"


def build_zero(stage, src, dst, dims, tensors=None, seed=0):
    """src/dst: a global_stepN directory. The fixture's dicts with every
    shape dimension d replaced by dims.get(d, d); the parameters are
    `tensors` (name -> tensor), or seeded random values."""
    import torch

    os.makedirs(dst)
    ms = {n: _load(os.path.join(src, n)) for n in _model_states(stage)}
    small = ms[_model_states(stage)[0]]["param_shapes"]
    assert len(small) == 1, "one param group"
    shapes = OrderedDict((k, torch.Size([dims.get(d, d) for d in s])) for k, s in small[0].items())
    total = sum(s.numel() for s in shapes.values())
    if tensors is None:
        flat = torch.randn(total, generator=torch.Generator().manual_seed(seed))
    else:
        flat = torch.cat([tensors[k].reshape(-1) for k in shapes])
    # DeepSpeed's ZeRO-2 fp32 params are views of one flat buffer: the module
    # holds one storage, each weight at its offset (as in the fixture)
    views, off = {}, 0
    for k, s in shapes.items():
        views[k] = flat[off:off + s.numel()].view(s)
        off += s.numel()
    for n, m in ms.items():
        # the loaded containers are kept (an OrderedDict's attributes, such as
        # the module state dict's _metadata, are pickled with it)
        for k, s in shapes.items():
            m["param_shapes"][0][k] = s
        if stage == 2:
            assert list(m["module"]) == list(shapes)
            for k in shapes:
                m["module"][k] = views[k]
        torch.save(m, os.path.join(dst, n))
    for r in range(WORLD):
        o = _load(os.path.join(src, _optim(r)))
        osd = o["optimizer_state_dict"]
        if stage == 2:
            # zero_to_fp32: the ranks' partitions concatenated in rank order are
            # the params back to back (no alignment padding for these sizes)
            assert total % (2 * WORLD) == 0
            assert osd["group_paddings"] == [0] and not any(osd["param_alignment_paddings"][0])
            per = total // WORLD
            groups = osd["single_partition_of_fp32_groups"]
            groups[0] = _like(groups[0], flat[r * per:(r + 1) * per].clone())
            part = groups[0]
            mapping = osd["param_slice_mappings"][0]
            fa = type(next(iter(mapping.values())))
            mapping.clear()
            off = 0
            for k, s in shapes.items():
                a, b = max(off, r * per), min(off + s.numel(), (r + 1) * per)
                if a < b:
                    mapping[k] = _new(fa, numel=b - a, start=a - r * per)
                off += s.numel()
            state = osd["base_optimizer_state"]["state"][0]
        else:
            # ZeRO-3: every param split in ceil(numel / world) per rank, the
            # last rank's piece zero-padded; a rank's pieces back to back
            pieces = []
            for k, s in shapes.items():
                per = -(-s.numel() // WORLD)
                seg = views[k].reshape(-1)[r * per:(r + 1) * per]
                pieces += [seg, torch.zeros(per - seg.numel())]
            groups = osd["fp32_flat_groups"]
            groups[0] = _like(groups[0], torch.cat(pieces))
            part = groups[0]
            state = osd["optimizer_state_dict"]["state"][0]
        for m in ("exp_avg", "exp_avg_sq"):
            if state[m].shape != part.shape:
                state[m] = torch.zeros(part.shape)
        torch.save(o, os.path.join(dst, _optim(r)))


def reference_zero(stage, ckdir):
    """{name: {shape, sha256}} of the fp32 state dict torch computes from the
    files' partitions (zero_to_fp32's merge), read memory-mapped."""
    ms = _load(os.path.join(ckdir, _model_states(stage)[0]), mmap=True)
    key = "single_partition_of_fp32_groups" if stage == 2 else "fp32_flat_groups"
    parts = [_load(os.path.join(ckdir, _optim(r)), mmap=True)["optimizer_state_dict"][key][0].detach() for r in range(WORLD)]
    out, off = {}, 0
    for k, s in ms["param_shapes"][0].items():
        h, n = hashlib.sha256(), s.numel()
        if stage == 2:
            per = parts[0].numel()
            for r in range(WORLD):
                a, b = max(off, r * per), min(off + n, (r + 1) * per)
                if a < b:
                    h.update(parts[r][a - r * per:b - r * per].numpy().data)
            off += n
        else:
            per, left = -(-n // WORLD), n
            for r in range(WORLD):
                take = min(per, left)
                h.update(parts[r][off:off + take].numpy().data)
                left -= take
            off += per
        out[k] = {"shape": list(s), "sha256": h.hexdigest()}
    return out


def same(a, b, path="$"):
    """Recursive equality of two loaded checkpoints (tensors: dtype, shape,
    strides, storage offset and bytes)."""
    import torch

    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad) == \
            (b.dtype, b.shape, b.stride(), b.storage_offset(), b.requires_grad), path
        assert a.untyped_storage().nbytes() == b.untyped_storage().nbytes(), path
        assert a.__dict__ == b.__dict__, path
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        same(getattr(a, "__dict__", None), getattr(b, "__dict__", None), f"{path}.__dict__")
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


def _pickle_ops(path):
    """The opcodes and arguments of a torch.save file's data.pkl."""
    import pickletools
    import zipfile

    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return [(op.name, arg) for op, arg, _ in pickletools.genops(z.read(name))]


def build_bin(dst, dims, seed=0):
    """A pytorch_model.bin (one file) as transformers 4 save_pretrained wrote
    it, of the scaled Llama's state dict (one storage per tensor)."""
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
    from gen_torchsave import save_bin_like_transformers4

    small = _load(os.path.join(TESTDATA, "deepspeed_zero2_llama", "ckpt", "global_step1",
                               "mp_rank_00_model_states.pt"))["param_shapes"][0]
    g = torch.Generator().manual_seed(seed)
    sd = OrderedDict((k, torch.randn([dims.get(d, d) for d in s], generator=g)) for k, s in small.items())
    ref = {k: {"shape": list(t.shape), "sha256": hashlib.sha256(t.numpy().data).hexdigest()} for k, t in sd.items()}
    os.makedirs(dst)
    save_bin_like_transformers4(types.SimpleNamespace(state_dict=lambda: sd), dst, "50GB")
    return ref


def main(argv):
    what, dst = argv[0], argv[1]
    dims = BIG if argv[-1] == "big" else {}
    if what == "bin":
        ref = build_bin(os.path.join(dst, "run"), dims)
    else:
        import torch
        from safetensors.torch import load_file

        stage = int(what[-1])
        case = TESTDATA / f"deepspeed_zero{stage}_llama"
        src, out = case / "ckpt" / "global_step1", os.path.join(dst, "global_step1")
        if dims:
            build_zero(stage, src, out, dims)
        else:
            # the fixture rebuilt from its own tensors must be the fixture
            build_zero(stage, src, out, {}, tensors=load_file(str(case / "expected.safetensors")))
            for n in _model_states(stage) + [_optim(r) for r in range(WORLD)]:
                same(_load(os.path.join(src, n)), _load(os.path.join(out, n)), n)
                assert _pickle_ops(os.path.join(src, n)) == _pickle_ops(os.path.join(out, n)), n
        ref = reference_zero(stage, out)
        if not dims:
            want = load_file(str(case / "expected.safetensors"))
            assert {k: v["sha256"] for k, v in ref.items()} == \
                {k: hashlib.sha256(t.numpy().data).hexdigest() for k, t in want.items()}
    with open(os.path.join(dst, "reference.json"), "w") as f:
        json.dump(ref, f)


# ---------------------------------------------------------------- the tests

def write(tmp_path, what, size):
    dst = tmp_path / "src"
    os.makedirs(dst)
    subprocess.run([sys.executable, os.path.abspath(__file__), what, str(dst), size], check=True, timeout=600)
    return dst, json.loads((dst / "reference.json").read_text())


def exported(out):
    """{name: {shape, sha256, dtype}} of every tensor in OUT's safetensors
    files, hashed from the file bytes in 1 MiB reads."""
    got = {}
    for fn in sorted(os.listdir(out)):
        if not fn.endswith(".safetensors"):
            continue
        with open(out / fn, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            header.pop("__metadata__", None)
            for k, v in header.items():
                a, b = v["data_offsets"]
                f.seek(8 + n + a)
                h = hashlib.sha256()
                while a < b:
                    chunk = f.read(min(MiB, b - a))
                    assert chunk, (fn, k)
                    h.update(chunk)
                    a += len(chunk)
                assert k not in got, k
                got[k] = {"shape": v["shape"], "sha256": h.hexdigest(), "dtype": v["dtype"]}
    return got


def check_export(src, ref, out):
    p, took, rss = run("export", "--quiet", src, out, timeout=600)
    assert p.returncode == 0, p.stderr
    got = exported(out)
    assert {k: v["dtype"] for k, v in got.items()} == {k: "F32" for k in ref}
    assert {k: (v["shape"], v["sha256"]) for k, v in got.items()} == \
        {k: (v["shape"], v["sha256"]) for k, v in ref.items()}
    return took, rss


@pytest.mark.parametrize("stage", [2, 3])
def test_rebuilt_zero_fixture_exports_as_the_fixture(stage, tmp_path):
    """The writer of the large checkpoints, given the small fixture's own
    tensors and sizes, writes back the fixture's dicts (every key, tensor
    layout and byte), which ckptfs exports byte-equal to the fixture."""
    dst, ref = write(tmp_path, f"zero{stage}", "small")
    check_export(dst / "global_step1", ref, tmp_path / "out")
    fixture = TESTDATA / f"deepspeed_zero{stage}_llama" / "ckpt" / "global_step1"
    check_export(fixture, ref, tmp_path / "out-fixture")
    for fn in os.listdir(tmp_path / "out"):
        assert (tmp_path / "out" / fn).read_bytes() == (tmp_path / "out-fixture" / fn).read_bytes(), fn


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_export_rss_is_bounded_by_the_cache_not_the_model(stage, tmp_path):
    dst, ref = write(tmp_path, f"zero{stage}", "big")
    ck = dst / "global_step1"
    partitions = sum(os.path.getsize(ck / _optim(r)) for r in range(WORLD))
    assert sum(4 * _numel(v["shape"]) for v in ref.values()) == MODEL_BYTES
    took, rss = check_export(ck, ref, tmp_path / "out")
    print(f"ZeRO-{stage}: model {MODEL_BYTES / MiB:.0f} MiB fp32 ({partitions / MiB:.0f} MiB of optim_states "
          f"files), export {took:.1f} s, peak RSS {rss:.0f} MiB")
    assert rss < RSS_LIMIT_MIB, rss


def test_bin_export_rss_is_bounded_by_the_cache_not_the_model(tmp_path):
    dst, ref = write(tmp_path, "bin", "big")
    size = os.path.getsize(dst / "run" / "pytorch_model.bin")
    assert size > MODEL_BYTES
    took, rss = check_export(dst / "run", ref, tmp_path / "out")
    print(f"pytorch_model.bin: {size / MiB:.0f} MiB, export {took:.1f} s, peak RSS {rss:.0f} MiB")
    assert rss < RSS_LIMIT_MIB, rss


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    main(sys.argv[1:])
