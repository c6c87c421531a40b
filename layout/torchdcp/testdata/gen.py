"""Writes the tiny DCP checkpoints the Go tests read, and what torch says about them.

Run from anywhere with the e2e venv:  e2e/.venv/bin/python layout/torchdcp/testdata/gen.py

Outputs (next to this file):
  plain/    single-process dcp.save of flat tensors of many dtypes, a 0-dim and
            a zero-size tensor, a non-contiguous view, and a BYTE_IO int
  nested/   {"model": {...}, "optimizer": {"state": ..., "param_groups": [...]}, "extra": 7}
  zstd/     like nested, written with _extensions=[ZStandard()]
  sharded/  2 gloo ranks: DTensor Shard(0), Shard(1), Replicate, uneven and
            empty shards; two files
  records/  single torch.save files the record locator reads directly: a view
            with a storage offset, a non-contiguous view, an expanded (stride 0)
            tensor, a Parameter, a float8 (v3) tensor
  plain_legacy.metadata  plain/.metadata re-pickled with the torch<=2.2
            TensorProperties class path (_shard) and 5-tuple state
  plain_mcore.metadata   plain/.metadata re-pickled as Megatron's MCoreMetadata
            with an mcore_data field
  manifest.json  per checkpoint: tensors in .metadata order (fqn, torch dtype,
            shape, chunks, planner path, hex of the full tensor bytes), objects,
            and storage_data entries as torch reads them back
"""
import json
import os
import pickle
import shutil
import sys
import tempfile
import types

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import metadata as md

HERE = os.path.dirname(os.path.abspath(__file__))


def raw(t):
    return bytes(t.detach().contiguous().clone().untyped_storage()).hex()


def plain_sd():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(3, 4, generator=g)
    sd = {
        "f32": f,
        "bf16": f.to(torch.bfloat16),
        "f16": f.to(torch.float16),
        "f64": f.to(torch.float64)[:2],
        "i64": torch.arange(-5, 5, dtype=torch.int64),
        "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3) - 3,
        "i16": torch.tensor([-2, 300], dtype=torch.int16),
        "i8": torch.tensor([-128, 127, 0], dtype=torch.int8),
        "u8": torch.tensor([0, 255, 7], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "f8e4m3": f.to(torch.float8_e4m3fn),
        "f8e5m2": f.to(torch.float8_e5m2),
        "u16": torch.tensor([1, 65535], dtype=torch.uint16),
        "u32": torch.tensor([1, 2**32 - 1], dtype=torch.uint32),
        "u64": torch.tensor([1, 2**63 + 5], dtype=torch.uint64),
        "c64": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
        "c128": torch.tensor([1 + 2j], dtype=torch.complex128),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "view": torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, 1:3],
        "step": 7,
    }
    return sd


def nested_sd():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 3, generator=g)
    b = torch.randn(4, generator=g)
    return {
        "model": {"l1.weight": w, "l1.bias": b},
        "optimizer": {
            "state": {
                "l1.weight": {"step": torch.tensor(2.0), "exp_avg": w * 0.1, "exp_avg_sq": w * w},
            },
            "param_groups": [{"lr": 0.01, "betas": (0.9, 0.99), "params": ["l1.weight", "l1.bias"]}],
        },
        "extra": 7,
    }


def save(name, sd, **writer_kw):
    path = os.path.join(HERE, name)
    shutil.rmtree(path, ignore_errors=True)
    dcp.save(sd, storage_writer=FileSystemWriter(path, **writer_kw), no_dist=True)


def flat(sd, prefix=()):
    """Flat fqn -> value, following DCP's default flattening (>= 2.4)."""
    out = {}
    if isinstance(sd, dict):
        for k, v in sd.items():
            out.update(flat(v, prefix + (str(k),)))
    elif isinstance(sd, list) and any(isinstance(x, (torch.Tensor, dict, list)) for x in sd):
        for i, v in enumerate(sd):
            out.update(flat(v, prefix + (str(i),)))
    else:
        out[".".join(prefix)] = sd
    return out


def describe(name, full):
    """What torch itself reads back from the checkpoint, plus expected bytes."""
    meta = FileSystemReader(os.path.join(HERE, name)).read_metadata()
    tensors, objects = [], []
    for fqn, item in meta.state_dict_metadata.items():
        path = [str(p) for p in meta.planner_data[fqn]] if meta.planner_data else None
        if isinstance(item, md.TensorStorageMetadata):
            tensors.append({
                "fqn": fqn,
                "path": path,
                "dtype": str(item.properties.dtype).removeprefix("torch."),
                "requires_grad": item.properties.requires_grad,
                "shape": list(item.size),
                "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in item.chunks],
                "hex": raw(full[fqn]),
            })
        else:
            objects.append({"fqn": fqn, "path": path})
    storage = []
    for idx, info in meta.storage_data.items():
        storage.append({
            "fqn": idx.fqn,
            "offset": None if idx.offset is None else list(idx.offset),
            "relative_path": info.relative_path,
            "file_offset": info.offset,
            "length": info.length,
            "transform_descriptors": list(info.transform_descriptors or []),
        })
    return {"tensors": tensors, "objects": objects, "storage": storage, "version": meta.version}


def repickle(src, dst, root_cls, extra_state):
    """Loads src/.metadata and pickles it again with another root class."""
    meta = FileSystemReader(os.path.join(HERE, src)).read_metadata()
    meta.storage_meta = None
    new = root_cls.__new__(root_cls)
    new.__dict__.update(meta.__dict__)
    new.__dict__.update(extra_state)
    with open(os.path.join(HERE, dst), "wb") as f:
        pickle.dump(new, f)


def legacy_repickle(src, dst):
    """src/.metadata as torch <= 2.2 wrote it: _shard TensorProperties, 5-tuple."""
    from torch.distributed._shard.sharded_tensor import metadata as shard_md

    meta = FileSystemReader(os.path.join(HERE, src)).read_metadata()
    meta.storage_meta = None
    for item in meta.state_dict_metadata.values():
        if isinstance(item, md.TensorStorageMetadata):
            p = item.properties
            item.properties = shard_md.TensorProperties(
                dtype=p.dtype, layout=p.layout, requires_grad=p.requires_grad,
                memory_format=p.memory_format, pin_memory=p.pin_memory)
    orig = shard_md.TensorProperties.__getstate__
    shard_md.TensorProperties.__getstate__ = lambda self: orig(self)[:5]
    try:
        with open(os.path.join(HERE, dst), "wb") as f:
            pickle.dump(meta, f, protocol=2)
    finally:
        shard_md.TensorProperties.__getstate__ = orig


def mcore_class():
    # Megatron is not installed: stand in its class under the real path.
    for mod in ["megatron", "megatron.core", "megatron.core.dist_checkpointing",
                "megatron.core.dist_checkpointing.strategies",
                "megatron.core.dist_checkpointing.strategies.torch"]:
        sys.modules.setdefault(mod, types.ModuleType(mod))
    m = sys.modules["megatron.core.dist_checkpointing.strategies.torch"]

    class MCoreMetadata(md.Metadata):
        pass

    MCoreMetadata.__module__ = m.__name__
    MCoreMetadata.__qualname__ = "MCoreMetadata"
    m.MCoreMetadata = MCoreMetadata
    return MCoreMetadata


def sharded_worker(rank, world, init_file, out):
    from torch.distributed.tensor import DTensor, Replicate, Shard, init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    full = sharded_full()
    def shard(name, dim, local):
        t = full[name]
        return DTensor.from_local(local, mesh, [Shard(dim)], run_check=False, shape=t.shape, stride=t.stride())

    sd = {
        # 5 rows over 2 ranks: 3 + 2.
        "rows": shard("rows", 0, torch.chunk(full["rows"], world, 0)[rank]),
        "cols": shard("cols", 1, torch.chunk(full["cols"], world, 1)[rank]),
        "rep": DTensor.from_local(full["rep"], mesh, [Replicate()], run_check=False),
        # 1 row over 2 ranks: rank 1 holds an empty shard.
        "thin": shard("thin", 0, full["thin"] if rank == 0 else full["thin"][1:]),
        "bf16rows": shard("bf16rows", 0, torch.chunk(full["bf16rows"], world, 0)[rank]),
        "plain": full["plain"],
        "meta": {"epoch": 3},
    }
    dcp.save(sd, checkpoint_id=out)
    dist.destroy_process_group()


def sharded_full():
    g = torch.Generator().manual_seed(2)
    return {
        "rows": torch.randn(5, 3, generator=g),
        "cols": torch.randn(2, 8, generator=g),
        "rep": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "thin": torch.randn(1, 4, generator=g),
        "bf16rows": torch.randn(3, 2, generator=g).to(torch.bfloat16),
        "plain": torch.arange(4, dtype=torch.int64),
    }


def records():
    out = os.path.join(HERE, "records")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    g = torch.Generator().manual_seed(3)
    cases = {
        "offset": torch.arange(10, dtype=torch.int64)[3:7],
        "noncontig": torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, 1:3],
        "expanded": torch.zeros(3).expand(2, 3),
        "param": torch.nn.Parameter(torch.randn(2, 2, generator=g)),
        "f8": torch.randn(2, 3, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(-1.25, dtype=torch.float64),
    }
    desc = {}
    for name, t in cases.items():
        torch.save(t, os.path.join(out, name + ".pt"))
        desc[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "hex": raw(t)}
    return desc


def main():
    manifest = {}

    sd = plain_sd()
    save("plain", sd)
    manifest["plain"] = describe("plain", flat(sd))

    sd = nested_sd()
    save("nested", sd)
    manifest["nested"] = describe("nested", flat(sd))

    from torch.distributed.checkpoint._extension import ZStandard

    sd = nested_sd()
    save("zstd", sd, _extensions=[ZStandard()])
    manifest["zstd"] = describe("zstd", flat(sd))

    out = os.path.join(HERE, "sharded")
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(sharded_worker, args=(2, os.path.join(tmp, "init"), out), nprocs=2, join=True)
    full = sharded_full()
    full["meta.epoch"] = 3
    manifest["sharded"] = describe("sharded", full)

    legacy_repickle("plain", "plain_legacy.metadata")
    repickle("plain", "plain_mcore.metadata", mcore_class(),
             extra_state={"mcore_data": {"f32": {"nd_reformulated_orig_global_shape": (3, 4)}}})

    manifest["records"] = records()

    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
