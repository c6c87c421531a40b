"""Write the .metadata of a large FSDP-sharded torch DCP checkpoint, with
sparse shard files (made by truncate: no tensor data), for timing how
ckptfs opens checkpoints of many ranks.

The tensors are Llama-3.1-405B-shaped by default (126 layers, hidden 16384,
ffn 53248, 8 kv heads, vocab 128256), saved as {"model": ..., "optim": ...}:
each tensor split on dim 0 as FSDP2's Shard(0) (torch.chunk: ceil(rows/W)
rows per rank, ranks past the last row hold an empty piece), one rank file
__<r>_0.distcp each. With --adam, optimizer state: optim.state.<fqn>.exp_avg
and exp_avg_sq (float32, sharded like the parameter), step (a 0-dim float32
tensor every rank holds) and param_groups.0.lr (a bytes item).

The .metadata is the bytes dcp.save writes for that state dict (its
planner, de-duplication, gathers and pickle), as gen_scale_dcpsave.py
has torch's dcp.save itself write them by threaded ranks (the oracle;
e2e/test_bench_gen.py compares the two byte for byte):
- storage_data rank by rank (the gathered write results), each entry's
  MetadataIndex with its chunk index and its own fqn string, a rank's
  relative_path one string;
- a tensor's empty pieces are one write item, kept by one rank (plan());
  so are a replicated step and the lr: dedup_save_plans gives each to the
  holder with the fewest planned bytes, so steps spread over the ranks;
- state_dict_metadata in the order the plans hold the items (rank 0's,
  then each rank's de-duplicated ones), TensorProperties with strides;
- planner_data's keys the last rank's strings (dict(ChainMap(...)));
- storage_meta (checkpoint_id = OUT or --checkpoint-id as a PosixPath, a
  uuid4 save_id or --save-id) and version "1.0.0".
A record's length is its chunk's bytes plus RECORD_OVERHEAD (64 for the lr);
a rank file holds its bytes items first, then its tensors (records()).

build() makes the same Metadata with torch's classes and the same objects
shared; its memory grows with the chunks (gigabytes from W = 512 with
Adam), so the file is written by write_fast(): the pickle stream tensor by
tensor (Stream: the opcodes, memo, batches and frames of pickle's C pickler
at the default protocol), in memory of the order of W + tensors (W = 512
with Adam: 14 s, 21 MiB here; BENCHMARKS.md, run Z-generator).

    python e2e/bench/gen_scale.py OUT --ranks 512 [--adam] [--layers 126] [--save-id ID]
"""

import argparse
import os
import pathlib
import pickle
import struct
import time
import uuid

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
    """(rank, offsets, sizes, elements) of each non-empty FSDP chunk of a
    tensor (torch.chunk's rows: ceil(rows/W) each; none past the end)."""
    rows = shape[0]
    per = -(-rows // ranks)
    rest = numel(shape[1:])
    zeros = (0,) * (len(shape) - 1)
    tail = tuple(shape[1:])
    for r in range(-(-rows // per)):
        n = min(per, rows - r * per)
        yield r, (r * per,) + zeros, (n,) + tail, n * rest


def strides(shape):
    """A contiguous tensor's strides (each rank's piece has its tensor's)."""
    out, n = [], 1
    for d in reversed(shape):
        out.append(n)
        n *= d
    return tuple(reversed(out))


class Item:
    """One item of the state dict as dcp.save plans it: its non-empty
    chunks (rank r < k holds chunk r), and the ranks that hold a write item
    every one of them has (an empty chunk of ranks k..W-1, a replicated
    step or lr), which dedup_save_plans gives to one of them (owner)."""

    def __init__(self, kind, fqn, path, shape, dtype, esize, ranks):
        self.kind, self.fqn, self.path, self.shape, self.dtype, self.esize = kind, fqn, path, shape, dtype, esize
        self.owner, self.ranks = None, ranks
        if kind == "sharded":
            # computed per rank (held()): a list of every chunk of every
            # tensor would be gigabytes at W = 512
            self.rows, self.rest = shape[0], numel(shape[1:])
            self.per = -(-self.rows // ranks)
            self.k = -(-self.rows // self.per)
            self.zeros = (0,) * (len(shape) - 1)
            self.shared = range(self.k, ranks) if self.k < ranks else None
            # WriteItem.tensor_storage_size(): the whole tensor's bytes,
            # for every chunk of it (the empty one too)
            self.storage_size = numel(shape) * esize
        else:
            self.k = 0
            self.shared = range(ranks)
            self.storage_size = 4 if kind == "scalar" else 1  # a bytes item counts 1

    def held(self, r):
        """rank r's write items of this item, after dedup: (offsets, index,
        bytes of its record)."""
        if r < self.k:
            return [((r * self.per,) + self.zeros, r, min(self.per, self.rows - r * self.per) * self.rest * self.esize)]
        if self.owner != r:
            return []
        if self.kind == "sharded":
            return [((self.shape[0],) + (0,) * (len(self.shape) - 1), self.k, 0)]
        if self.kind == "scalar":
            return [((), 0, 4)]
        return [(None, None, 64)]

    def chunk_list(self):
        """TensorStorageMetadata.chunks: (offsets, sizes) in rank order."""
        out = [(off, size) for _, off, size, _ in shards(self.shape, self.ranks)] if self.kind == "sharded" else []
        if self.kind == "sharded" and self.shared is not None:
            out.append(((self.shape[0],) + (0,) * (len(self.shape) - 1), (0,) + tuple(self.shape[1:])))
        elif self.kind == "scalar":
            out.append(((), ()))
        return out


def records(its, r):
    """Rank r's write results in the order FileSystemWriter writes its
    file: the bytes items, then the tensors', each in plan order."""
    for it in its:
        if it.kind == "bytes":
            yield from ((it, *h) for h in it.held(r))
    for it in its:
        if it.kind != "bytes":
            yield from ((it, *h) for h in it.held(r))


def plan(a):
    """The items, each shared one given the rank dedup_save_plans picks
    (torch.distributed.checkpoint._dedup_save_plans): the write items in
    the order the gathered plans first hold them (rank 0's, then each
    rank's new ones), each to the holder whose plan has the fewest bytes
    so far (the first in its set's order on a tie)."""
    its = [Item(*it, a.ranks) for it in items(a)]
    size = [0] * a.ranks
    for r in range(a.ranks):
        for it in its:
            if r < it.k:
                size[r] += it.storage_size
            elif it.shared is not None and r == it.shared[0]:
                holders = set()
                for h in it.shared:
                    holders.add(h)
                it.owner = min(holders, key=size.__getitem__)
                size[it.owner] += it.storage_size
    return its



def _dcp():
    import torch
    from torch.distributed.checkpoint import filesystem, metadata
    return torch, metadata, filesystem


def fresh(x):
    """A string equal to x but not x (pickle memoizes by identity)."""
    return (x + ".")[:-1]


def build(a):
    """The Metadata of write_fast(a), built with torch's classes and the
    same objects shared (what pickle.dumps of it must equal: the tests'
    check of Stream's pickling rules at sizes dcp.save cannot reach here),
    and the rank files' lengths."""
    torch, md, fs = _dcp()
    its = plan(a)
    keys = {it.fqn: fresh(it.fqn) for it in its}  # planner_data's: the last rank's
    one = {}  # the paths' strings, one object per value
    planner = {keys[it.fqn]: tuple(e if isinstance(e, int) else one.setdefault(e, fresh(e)) for e in it.path)
               for it in its}
    sdm, seen = {}, set()
    for r in range(a.ranks):
        for it in its:
            if id(it) in seen or not it.held(r):
                continue
            seen.add(id(it))
            key = keys[it.fqn] if r == a.ranks - 1 else fresh(it.fqn)
            if it.kind == "bytes":
                sdm[key] = md.BytesStorageMetadata()
                continue
            props = md.TensorProperties(dtype=getattr(torch, it.dtype), strides=strides(it.shape))
            chunks = [md.ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(z)) for o, z in it.chunk_list()]
            sdm[key] = md.TensorStorageMetadata(props, torch.Size(it.shape), chunks)
    storage, sizes = {}, [0] * a.ranks
    for r in range(a.ranks):
        path = f"__{r}_0.distcp"
        for it, off, index, nbytes in records(its, r):
            mi = md.MetadataIndex(fresh(it.fqn), None if off is None else torch.Size(off), index)
            storage[mi] = fs._StorageInfo(path, sizes[r], nbytes + RECORD_OVERHEAD)
            sizes[r] += nbytes + RECORD_OVERHEAD
    meta = md.StorageMeta(checkpoint_id=pathlib.Path(a.checkpoint_id), save_id=a.save_id)
    return md.Metadata(sdm, planner, storage, meta, fresh("1.0.0")), sizes


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

    def properties(self, dtype, strides):
        """TensorProperties(dtype): its state is a tuple (dtype, layout,
        requires_grad, memory_format, pin_memory, strides)."""
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
        self.tuple(strides)
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

    def tensor(self, fqn, dtype, shape, chunks, key=None):
        """An item of state_dict_metadata: fqn (the string of the gathered
        plan that holds it first, memoized under key) -> TensorStorageMetadata."""
        self.str(fqn, key)
        self.newobj(MD, "TensorStorageMetadata", 3)
        self.str("properties", "properties")
        self.properties(dtype, strides(shape))
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

    def storage(self, fqn, offsets, index, rank, offset, length, g=None):
        """An item of storage_data: MetadataIndex -> _StorageInfo. The fqn
        is a string of its own (each rank's write results are gathered),
        the rank's path one string for all of the rank's entries."""
        keys = 2 if offsets is None else 3
        if g is not None and keys == 3:
            a, m = self.size_segs(g["Size"], offsets, b"ub")
            self.saves([g["MetadataIndex"], b")\x81\x94", b"}\x94(", g["fqn"], str_op(fqn) + b"\x94",
                        g["index"], INTS[index] if index < 1 << 16 else int_op(index), g["offset"], *a], 3 + m)
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
        self.str(fqn)
        self.str("index", "index")
        if index is None:
            self.const(b"N")
        else:
            self.int(index)
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

    def storage_meta(self, checkpoint_id, save_id):
        """StorageMeta(checkpoint_id=PosixPath(checkpoint_id), save_id):
        the path REDUCEd from its parts."""
        self.newobj(MD, "StorageMeta", 4)
        self.str("checkpoint_id")
        self.glob("pathlib", "PosixPath", "pathlib")
        self.b()
        parts = pathlib.PurePosixPath(checkpoint_id).parts
        if len(parts) > 3:
            self.buf += b"("
        for p in parts:
            self.str(p)
        self.buf += b"\x85\x86\x87"[len(parts) - 1:len(parts)] if len(parts) <= 3 else b"t"
        self.memoize()
        self.buf += b"R"
        self.memoize()
        self.str("save_id")
        self.str(save_id)
        self.str("load_id")
        self.const(b"N")
        self.str("modules")
        self.container(b"]", 0)
        self.state_end(4)


def write_fast(a, f):
    """Writes the .metadata dcp.save writes for a's checkpoint to f;
    returns the rank files' lengths."""
    its = plan(a)
    s = Stream(f)
    s.newobj(MD, "Metadata", 5)
    s.str("state_dict_metadata")
    # the order create_default_global_save_plan meets the fqns in: rank
    # by rank, each plan's items in order
    # (rank, item). planner_data is dict(ChainMap(*each rank's mapping)):
    # its keys are the last rank's strings, which the last rank's plan
    # (pickled with them) names its items by, so a key met first in the
    # last rank's plan is one string with planner_data's.
    order, seen = [], set()
    for r in range(a.ranks):
        for it in its:
            if id(it) not in seen and it.held(r):
                seen.add(id(it))
                order.append((r, it))
    s.container(b"}", len(order))
    for i, (r, it) in enumerate(order):
        key = ("fqn", it.fqn) if r == a.ranks - 1 else None
        if it.kind == "bytes":
            s.str(it.fqn, key)
            s.newobj(MD, "BytesStorageMetadata", 0)
        else:
            s.tensor(it.fqn, it.dtype, it.shape, it.chunk_list(), key)
        s.dict_item_done(i, len(order))
    s.dict_end(len(order))
    s.str("planner_data")
    s.container(b"}", len(its))
    for i, it in enumerate(its):
        s.str(it.fqn, ("fqn", it.fqn))
        s.tuple(it.path)
        s.dict_item_done(i, len(its))
    s.dict_end(len(its))
    s.str("storage_data")
    sizes = [0] * a.ranks
    n = sum(it.k + (it.owner is not None) for it in its)
    s.container(b"}", n)
    i, g = 0, None
    for r in range(a.ranks):
        for it, off, index, nbytes in records(its, r):
            length = nbytes + RECORD_OVERHEAD
            g = g or s.warm(s.STORAGE_REFS)
            s.storage(it.fqn, off, index, r, sizes[r], length, g)
            sizes[r] += length
            s.dict_item_done(i, n)
            i += 1
    s.dict_end(n)
    s.str("storage_meta")
    s.storage_meta(a.checkpoint_id, a.save_id)
    s.str("version")
    s.str("1.0.0")
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
    ap.add_argument("--checkpoint-id", help="the path dcp.save was given (storage_meta.checkpoint_id; default: OUT)")
    ap.add_argument("--save-id", help="storage_meta.save_id (default: a fresh uuid4, as dcp.save's)")
    a = ap.parse_args()
    a.checkpoint_id = a.checkpoint_id or a.out
    a.save_id = a.save_id or str(uuid.uuid4())
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    meta = os.path.join(a.out, ".metadata")
    with open(meta, "wb") as f:
        sizes = write_fast(a, f)
    for r in range(a.ranks):
        with open(os.path.join(a.out, f"__{r}_0.distcp"), "wb") as f:
            f.truncate(sizes[r])
    n = sum(1 for _ in items(a))
    print(f"{a.out}: {n} items, .metadata {os.path.getsize(meta)} bytes, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
