"""Write the .metadata of a large FSDP-sharded torch DCP checkpoint, with
sparse shard files (made by truncate: no tensor data), for timing how
ckptfs opens checkpoints of many ranks.

The tensors are Llama-3.1-405B-shaped by default (126 layers, hidden 16384,
ffn 53248, 8 kv heads, vocab 128256), saved as {"model": ..., "optim": ...}:
each tensor split on dim 0 into W chunks (FSDP: ceil(rows/W) rows per rank,
empty chunks past the end), one per rank file __<r>_0.distcp. With --adam,
optimizer state as torch.optim.Adam keeps it: optim.state.<fqn>.exp_avg and
exp_avg_sq (float32, sharded like the parameter) and step (a 0-dim float32
tensor, saved by rank 0).

The .metadata is the bytes pickle.dump writes for torch's own Metadata
(TensorStorageMetadata, ChunkStorageMetadata, MetadataIndex, _StorageInfo)
as dcp.save pickles it; as in a real save, the objects of each rank's write
results are distinct (they were gathered), and a rank's relative_path is one
string. Built as objects (--slow: build()), the memory grows with the chunks
(gigabytes from W = 512 with Adam: BENCHMARKS.md, run Y-scale); so by
default the pickle stream is written tensor by tensor (Stream: the opcodes,
memo, batches and frames of pickle's C pickler at the default protocol), in memory of
the order of W + tensors. The two are byte-identical (e2e/test_bench_gen.py
compares them at several sizes).

    python e2e/bench/gen_scale.py OUT --ranks 512 [--adam] [--layers 126] [--slow]
"""

import argparse
import os
import pickle
import struct
import time

# The record a chunk's bytes sit in (a torch.save zip) is this much larger
# than the bytes.
RECORD_OVERHEAD = 1024

MD = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"


def llama_tensors(layers, hidden, ffn, kv_heads, head_dim, vocab):
    """(name, shape) of a Llama's HF state dict."""
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    kv = kv_heads * head_dim
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (hidden, hidden)),
                (p + "self_attn.k_proj.weight", (kv, hidden)),
                (p + "self_attn.v_proj.weight", (kv, hidden)),
                (p + "self_attn.o_proj.weight", (hidden, hidden)),
                (p + "mlp.gate_proj.weight", (ffn, hidden)),
                (p + "mlp.up_proj.weight", (ffn, hidden)),
                (p + "mlp.down_proj.weight", (hidden, ffn)),
                (p + "input_layernorm.weight", (hidden,)),
                (p + "post_attention_layernorm.weight", (hidden,))]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def items(a):
    """The checkpoint's items in save order: (kind, fqn, planner path,
    shape, dtype, element size), kind "sharded", "scalar" or "bytes". The
    path's strings are the objects pickle sees (a param's name is one
    string in every path naming it; the rest are constants)."""
    params = llama_tensors(a.layers, a.hidden, a.ffn, a.kv_heads, a.head_dim, a.vocab)
    for name, shape in params:
        yield "sharded", "model." + name, ("model", name), shape, "bfloat16", 2
    if a.adam:
        for name, shape in params:
            for st in ("exp_avg", "exp_avg_sq"):
                yield "sharded", f"optim.state.{name}.{st}", ("optim", "state", name, st), shape, "float32", 4
            yield "scalar", f"optim.state.{name}.step", ("optim", "state", name, "step"), (), "float32", 4
        yield "bytes", "optim.param_groups.0.lr", ("optim", "param_groups", 0, "lr"), None, None, 0


def shards(shape, ranks):
    """(rank, offsets, sizes, elements) of each FSDP chunk of a tensor."""
    rows = shape[0]
    per = -(-rows // ranks)
    rest = numel(shape[1:])
    zeros = (0,) * (len(shape) - 1)
    tail = tuple(shape[1:])
    for r in range(ranks):
        start = min(r * per, rows)
        n = min(per, rows - start)
        yield r, (start,) + zeros, (n,) + tail, n * rest


def _dcp():
    import torch
    from torch.distributed.checkpoint import filesystem, metadata
    return torch, metadata, filesystem


class Writer:
    """Builds state_dict_metadata, planner_data and storage_data with
    torch's classes, and keeps each rank file's length."""

    def __init__(self, ranks):
        self.torch, self.md, self.fs = _dcp()
        self.ranks = ranks
        self.sdm, self.planner, self.storage = {}, {}, {}
        self.sizes = [0] * ranks
        self.paths = [f"__{r}_0.distcp" for r in range(ranks)]

    def put(self, rank, fqn, offsets, nbytes):
        length = nbytes + RECORD_OVERHEAD
        # Fresh torch.Size objects, as after a gather: nothing shared with
        # the chunk's own.
        self.storage[self.md.MetadataIndex(fqn, self.torch.Size(offsets))] = self.fs._StorageInfo(
            self.paths[rank], self.sizes[rank], length)
        self.sizes[rank] += length

    def sharded(self, fqn, path, shape, dtype, esize):
        Size, chunks = self.torch.Size, []
        for r, off, size, n in shards(shape, self.ranks):
            chunks.append(self.md.ChunkStorageMetadata(offsets=Size(off), sizes=Size(size)))
            self.put(r, fqn, off, n * esize)
        self.sdm[fqn] = self.md.TensorStorageMetadata(self.md.TensorProperties(dtype=dtype), Size(shape), chunks)
        self.planner[fqn] = path

    def scalar(self, fqn, path):
        Size = self.torch.Size
        self.sdm[fqn] = self.md.TensorStorageMetadata(self.md.TensorProperties(dtype=self.torch.float32), Size(()),
                                                      [self.md.ChunkStorageMetadata(offsets=Size(()), sizes=Size(()))])
        self.planner[fqn] = path
        self.put(0, fqn, (), 4)

    def blob(self, fqn, path):
        self.sdm[fqn] = self.md.BytesStorageMetadata()
        self.planner[fqn] = path
        self.storage[self.md.MetadataIndex(fqn)] = self.fs._StorageInfo(self.paths[0], self.sizes[0], 64)
        self.sizes[0] += 64

    def metadata(self):
        return self.md.Metadata(state_dict_metadata=self.sdm, planner_data=self.planner, storage_data=self.storage)


def build(a):
    """The Metadata built with torch's classes, and the rank files' lengths."""
    w = Writer(a.ranks)
    for kind, fqn, path, shape, dtype, esize in items(a):
        if kind == "sharded":
            w.sharded(fqn, path, shape, getattr(w.torch, dtype), esize)
        elif kind == "scalar":
            w.scalar(fqn, path)
        else:
            w.blob(fqn, path)
    return w.metadata(), w.sizes


# dcp.save pickles with the default protocol; 4 and 5 write these objects
# with the same opcodes.
PROTOCOL = pickle.DEFAULT_PROTOCOL
assert PROTOCOL in (4, 5), PROTOCOL
FRAME = 64 * 1024  # pickle's _FRAME_SIZE_TARGET
BATCH = 1000  # pickle's _BATCHSIZE


def int_op(v):
    """pickle's opcode for an int (save_long, protocol 2 and up)."""
    if 0 <= v <= 0xff:
        return b"K" + bytes((v,))
    if 0 <= v <= 0xffff:
        return b"M" + struct.pack("<H", v)
    if -0x80000000 <= v <= 0x7fffffff:
        return b"J" + struct.pack("<i", v)
    enc = pickle.encode_long(v)
    return b"\x8a" + bytes((len(enc),)) + enc


INTS = [int_op(v) for v in range(1 << 16)]


def get_op(i):
    return b"h" + bytes((i,)) if i < 256 else b"j" + struct.pack("<I", i)


def str_op(s):
    b = s.encode("utf-8", "surrogatepass")
    return (b"\x8c" + bytes((len(b),)) if len(b) <= 0xff else b"X" + struct.pack("<I", len(b))) + b


class Stream:
    """The bytes of pickle.dump(obj, f) (the C pickler, protocol 4 or 5), for the
    objects dcp.save pickles, written as they are described. Every save()
    of the pickler begins with b(): there it ends a frame of 64 KiB or more.
    Objects are memoized in the order the pickler memoizes them; memo keys
    name the objects referred to again (a class, an interned attribute
    name, a tensor's fqn, a rank's path); the rest are counted only."""

    def __init__(self, f):
        self.f = f
        self.buf = bytearray()
        self.n = 0
        self.memo = {}
        f.write(b"\x80" + bytes((PROTOCOL,)))

    def b(self):
        if len(self.buf) >= FRAME:
            self.f.write(b"\x95" + struct.pack("<Q", len(self.buf)))
            self.f.write(self.buf)
            del self.buf[:]

    def end(self):
        self.buf += b"."
        if len(self.buf) >= 4:
            self.f.write(b"\x95" + struct.pack("<Q", len(self.buf)))
        self.f.write(self.buf)

    def memoize(self, key=None):
        self.buf += b"\x94"
        self.n += 1
        if key is not None:
            self.memo[key] = self.n - 1

    def got(self, key):
        """save() of an object already memoized under key: its GET."""
        self.b()
        i = self.memo.get(key)
        if i is None:
            return False
        self.buf += get_op(i)
        return True

    def str(self, s, key=None):
        if key is None or not self.got(key):
            self.b()
            self.buf += str_op(s)
            self.memoize(key)

    def int(self, v):
        self.b()
        self.buf += INTS[v] if 0 <= v < 1 << 16 else int_op(v)

    def const(self, op):
        """None or False."""
        self.b()
        self.buf += op

    def glob(self, module, name, modkey):
        """save_global: the module's name (one string object per modkey), the name."""
        if not self.got(("global", module, name)):
            self.str(module, modkey)
            self.str(name)
            self.buf += b"\x93"
            self.memoize(("global", module, name))

    def tuple(self, elems):
        """A fresh tuple of ints and strings (strings keyed by value)."""
        self.b()
        n = len(elems)
        if n == 0:
            self.buf += b")"
            return
        if n > 3:
            self.buf += b"("
        for e in elems:
            if isinstance(e, int):
                self.int(e)
            else:
                self.str(e, ("str", e))
        self.buf += b"\x85\x86\x87"[n - 1:n] if n <= 3 else b"t"
        self.memoize()

    def size(self, dims):
        """A fresh torch.Size: REDUCE of torch.Size on (tuple(dims),)."""
        self.b()
        self.glob("torch", "Size", "torch:Size")
        self.b()
        self.tuple(dims)
        self.buf += b"\x85"
        self.memoize()
        self.buf += b"R"
        self.memoize()

    def newobj(self, module, name, items):
        """A dataclass object: copyreg.__newobj__ of its class, then its
        state dict of items keys (0: no state)."""
        self.b()
        self.glob(module, name, module)
        self.b()
        self.buf += b")\x81"
        self.memoize()
        if items:
            self.b()
            self.buf += b"}"
            self.memoize()
            self.buf += b"(" if items > 1 else b""

    def state_end(self, items):
        self.buf += b"ub" if items > 1 else b"sb"

    def container(self, empty, n):
        """The start of a dict (empty "}") or list ("]") of n items."""
        self.b()
        self.buf += empty
        self.memoize()
        if n > 1:
            self.buf += b"("

    def dict_item_done(self, i, n):
        """After the i-th of n items of a dict: batches of 1000 (the C
        pickler closes a full batch and opens the next even when no item
        is left)."""
        if n == 1:
            self.buf += b"s"
        elif (i + 1) % BATCH == 0:
            self.buf += b"u("

    def dict_end(self, n):
        if n > 1:
            self.buf += b"u"

    def list_item_done(self, i, n):
        if n == 1:
            self.buf += b"a"
        elif i + 1 == n:
            self.buf += b"e"
        elif (i + 1) % BATCH == 0:
            self.buf += b"e("

    def saves(self, segs, memos):
        """Bytes of several saves, each segment beginning where one
        begins: joined, unless a frame can end within them."""
        blob = b"".join(segs)
        if len(self.buf) + len(blob) < FRAME:
            self.buf += blob
        else:
            for x in segs:
                self.b()
                self.buf += x
        self.n += memos

    # torch's DCP classes, as dcp.save's pickle holds them.

    def properties(self, dtype):
        """TensorProperties(dtype): its state is a tuple (dtype, layout,
        requires_grad, memory_format, pin_memory, None)."""
        self.newobj(MD, "TensorProperties", 0)
        self.b()
        self.buf += b"("
        self.glob("torch", dtype, "torch:dtype")
        if not self.got("strided"):
            self.glob("torch.serialization", "_get_layout", None)
            self.b()
            self.str("torch.strided")
            self.buf += b"\x85"
            self.memoize()
            self.buf += b"R"
            self.memoize("strided")
        self.const(b"\x89")
        if not self.got("contiguous"):
            self.glob(MD, "_MEM_FORMAT_ENCODING", MD)
            self.b()
            self.int(0)
            self.buf += b"\x85"
            self.memoize()
            self.buf += b"R"
            self.memoize("contiguous")
        self.const(b"\x89")
        self.const(b"N")
        self.buf += b"t"
        self.memoize()
        self.buf += b"b"

    CHUNK_REFS = [("global", MD, "ChunkStorageMetadata"), "offsets", "sizes", ("global", "torch", "Size")]
    STORAGE_REFS = [("global", MD, "MetadataIndex"), "fqn", "index", "offset", ("global", FS, "_StorageInfo"),
                    "relative_path", "length", ("global", "torch", "Size")]

    def warm(self, keys):
        """The GETs of what every chunk (CHUNK_REFS) or storage entry
        (STORAGE_REFS) refers to, once the first was written (None before)."""
        if not all(k in self.memo for k in keys):
            return None
        return {k if isinstance(k, str) else k[2]: get_op(self.memo[k]) for k in keys}

    def size_segs(self, g_size, dims, tail):
        """size()'s segments (with tail after the last) and memo count."""
        n = len(dims)
        if n == 0:
            return [g_size, b")\x85\x94R\x94" + tail], 2
        segs = [g_size] + [INTS[v] if 0 <= v < 1 << 16 else int_op(v) for v in dims]
        segs[-1] += (b"\x85\x86\x87"[n - 1:n] if n <= 3 else b"t") + b"\x94\x85\x94R\x94" + tail
        if n > 3:
            segs[1] = b"(" + segs[1]
        return segs, 3

    def chunk(self, offsets, sizes, g=None):
        if g is not None:
            a, m1 = self.size_segs(g["Size"], offsets, b"")
            b, m2 = self.size_segs(g["Size"], sizes, b"ub")
            self.saves([g["ChunkStorageMetadata"], b")\x81\x94", b"}\x94(", g["offsets"], *a, g["sizes"], *b], 2 + m1 + m2)
            return
        self.newobj(MD, "ChunkStorageMetadata", 2)
        self.str("offsets", "offsets")
        self.size(offsets)
        self.str("sizes", "sizes")
        self.size(sizes)
        self.state_end(2)

    def tensor(self, fqn, dtype, shape, chunks):
        """An item of state_dict_metadata: fqn -> TensorStorageMetadata."""
        self.str(fqn, ("fqn", fqn))
        self.newobj(MD, "TensorStorageMetadata", 3)
        self.str("properties", "properties")
        self.properties(dtype)
        self.str("size", "size")
        self.size(shape)
        self.str("chunks", "chunks")
        self.container(b"]", len(chunks))
        g = self.warm(self.CHUNK_REFS)
        for i, (off, sizes) in enumerate(chunks):
            self.chunk(off, sizes, g)
            self.list_item_done(i, len(chunks))
            g = g or self.warm(self.CHUNK_REFS)
        self.state_end(3)

    def storage(self, fqn, offsets, rank, offset, length, g=None):
        """An item of storage_data: MetadataIndex -> _StorageInfo."""
        keys = 2 if offsets is None else 3
        if g is not None and keys == 3 and ("fqn", fqn) in self.memo:
            a, m = self.size_segs(g["Size"], offsets, b"ub")
            self.saves([g["MetadataIndex"], b")\x81\x94", b"}\x94(", g["fqn"], get_op(self.memo[("fqn", fqn)]),
                        g["index"], b"N", g["offset"], *a], 2 + m)
            i = self.memo.get(("path", rank))
            path = get_op(i) if i is not None else str_op(f"__{rank}_0.distcp") + b"\x94"
            if i is None:
                self.memo[("path", rank)] = self.n + 2
            self.saves([g["_StorageInfo"], b")\x81\x94", b"}\x94(", g["relative_path"], path, g["offset"],
                        INTS[offset] if offset < 1 << 16 else int_op(offset), g["length"],
                        (INTS[length] if length < 1 << 16 else int_op(length)) + b"ub"], 2 + (i is None))
            return
        self.newobj(MD, "MetadataIndex", keys)
        self.str("fqn", "fqn")
        self.str(fqn, ("fqn", fqn))
        self.str("index", "index")
        self.const(b"N")
        if offsets is not None:
            self.str("offset", "offset")
            self.size(offsets)
        self.state_end(keys)
        self.newobj(FS, "_StorageInfo", 3)
        self.str("relative_path", "relative_path")
        self.str(f"__{rank}_0.distcp", ("path", rank))
        self.str("offset", "offset")
        self.int(offset)
        self.str("length", "length")
        self.int(length)
        self.state_end(3)


def places(kind, shape, esize, ranks, sizes):
    """storage_data's entries of an item: (rank, offsets, offset in the
    rank file, length), each rank file's length in sizes grown by its
    records. The empty chunks past a tensor's last row all have the same
    MetadataIndex: the dict keeps the first one's place and the last one's
    value (only the record's length is left of the others)."""
    if kind == "scalar":
        out = [(0, (), sizes[0], 4 + RECORD_OVERHEAD)]
    elif kind == "bytes":
        out = [(0, None, sizes[0], 64)]
    else:
        out, seen = [], {}
        for r, off, _, e in shards(shape, ranks):
            place = (r, off, sizes[r], e * esize + RECORD_OVERHEAD)
            sizes[r] += place[3]
            if off in seen:
                out[seen[off]] = place
            else:
                seen[off] = len(out)
                out.append(place)
        return out
    sizes[0] += out[0][3]
    return out


def write_fast(a, f):
    """Writes build(a)'s pickle to f, tensor by tensor; returns the rank
    files' lengths."""
    its = list(items(a))
    s = Stream(f)
    s.newobj(MD, "Metadata", 5)
    s.str("state_dict_metadata")
    s.container(b"}", len(its))
    for i, (kind, fqn, path, shape, dtype, esize) in enumerate(its):
        if kind == "sharded":
            s.tensor(fqn, dtype, shape, [(off, size) for _, off, size, _ in shards(shape, a.ranks)])
        elif kind == "scalar":
            s.tensor(fqn, dtype, (), [((), ())])
        else:
            s.str(fqn, ("fqn", fqn))
            s.newobj(MD, "BytesStorageMetadata", 0)
        s.dict_item_done(i, len(its))
    s.dict_end(len(its))
    s.str("planner_data")
    s.container(b"}", len(its))
    for i, (kind, fqn, path, *_) in enumerate(its):
        s.str(fqn, ("fqn", fqn))
        s.tuple(path)
        s.dict_item_done(i, len(its))
    s.dict_end(len(its))
    s.str("storage_data")
    sizes = [0] * a.ranks
    n = sum(len(places(kind, shape, esize, a.ranks, [0] * a.ranks)) for kind, _, _, shape, _, esize in its)
    s.container(b"}", n)
    i = 0
    for kind, fqn, path, shape, dtype, esize in its:
        g = s.warm(s.STORAGE_REFS)
        for r, off, at, length in places(kind, shape, esize, a.ranks, sizes):
            s.storage(fqn, off, r, at, length, g)
            g = g or s.warm(s.STORAGE_REFS)
            s.dict_item_done(i, n)
            i += 1
    s.dict_end(n)
    s.str("storage_meta")
    s.const(b"N")
    s.str("version")
    s.const(b"N")
    s.state_end(5)
    s.end()
    return sizes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--adam", action="store_true", help="add Adam's exp_avg, exp_avg_sq and step")
    ap.add_argument("--layers", type=int, default=126)
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--ffn", type=int, default=53248)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--slow", action="store_true", help="build torch's Metadata objects and pickle.dump them")
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    meta = os.path.join(a.out, ".metadata")
    with open(meta, "wb") as f:
        if a.slow:
            md, sizes = build(a)
            pickle.dump(md, f)
        else:
            sizes = write_fast(a, f)
    for r in range(a.ranks):
        with open(os.path.join(a.out, f"__{r}_0.distcp"), "wb") as f:
            f.truncate(sizes[r])
    n = sum(1 for _ in items(a))
    print(f"{a.out}: {n} items, .metadata {os.path.getsize(meta)} bytes, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
