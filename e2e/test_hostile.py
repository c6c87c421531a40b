"""A checkpoint is untrusted input. Each hostile case goes through
`ckptfs inspect`, `ckptfs export` and a mount: it must end in time and in
bounded memory with one clear line naming the file and the cause, and no
byte from outside the source may come out."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import BIN, TESTDATA

SECRET = b"TOP-SECRET-BYTES"


# Spawns ckptfs from a fresh, small interpreter and reports its peak RSS.
# (A child forked from the test process would report the test's own RSS:
# ru_maxrss keeps the high-water mark from before exec.)
SPAWN = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run(*args, timeout=20):
    """Run ckptfs with a time bound; return (proc, seconds, its peak RSS in MiB)."""
    with tempfile.NamedTemporaryFile() as rss:
        start = time.monotonic()
        p = subprocess.run([sys.executable, "-c", SPAWN, rss.name, BIN, *map(str, args)],
                           capture_output=True, text=True, timeout=timeout)
        took = time.monotonic() - start
        peak = int(open(rss.name).read() or 0) / 1024
    return p, took, peak


def copy_case(name, dst):
    shutil.copytree(TESTDATA / name / "ckpt", dst, symlinks=True)
    return dst


def symlinked_sidecar(root, secret):
    ck = copy_case("sample", root / "ck")
    os.remove(ck / "config.json")
    os.symlink(secret, ck / "config.json")
    return ck, None, None  # not an error: the link is not followed


def symlinked_shard(root, secret):
    ck = copy_case("fsdp2_4ranks", root / "ck")
    os.remove(ck / "__0_0.distcp")
    os.symlink(secret, ck / "__0_0.distcp")
    return ck, "__0_0.distcp", "escapes the source tree"


def fifo_file_index(root, secret):
    ck = copy_case("nemo_automodel_sharded", root / "ck") / "epoch_0_step_1" / "model"
    os.remove(ck / ".hf_metadata" / "fqn_to_file_index_mapping.json")
    os.mkfifo(ck / ".hf_metadata" / "fqn_to_file_index_mapping.json")
    return ck, "fqn_to_file_index_mapping.json", "FIFO"


def fifo_megatron_config(root, secret):
    ck = copy_case("megatron", root / "ck")
    os.remove(ck / "metadata.json")
    os.mkfifo(ck / "metadata.json")
    return ck, None, None  # not Megatron then: an ordinary DCP checkpoint


def fifo_metadata(root, secret):
    ck = copy_case("fsdp2_4ranks", root / "ck")
    os.remove(ck / ".metadata")
    os.mkfifo(ck / ".metadata")
    return ck, ".metadata", "FIFO"


def corrupt_first_shard(root, secret):
    ck = copy_case("hf_sharded", root / "ck")
    first = sorted(p for p in os.listdir(ck) if p.startswith("shard-"))[0]
    with open(ck / first, "r+b") as f:
        f.write(b"\xff" * 16)
    return ck, first, "header"


def directory_as_shard(root, secret):
    ck = copy_case("hf_sharded", root / "ck")
    first = sorted(p for p in os.listdir(ck) if p.startswith("shard-"))[0]
    os.remove(ck / first)
    os.mkdir(ck / first)
    return ck, first, "not a regular file"


def truncated_shard(root, secret):
    ck = copy_case("fsdp2_4ranks", root / "ck")
    os.truncate(ck / "__1_0.distcp", 100)
    return ck, "__1_0.distcp", "past end of file"


def memo_bomb(root, secret):
    """305 bytes of tuples shared through the pickle memo, used as dict keys."""
    ck = root / "ck"
    shutil.copytree(TESTDATA / "hostile" / "metadata-memo-bomb", ck)
    return ck, ".metadata", "pickle"


def zero_size_stacked(root, secret):
    """384 bytes whose names match the built-in megatron-gpt mapping, each
    stacked tensor 2^40 empty layers: once a fatal out-of-memory of the
    whole mount. Not an error: no mapping fits, the names show as saved."""
    import numpy as np
    from safetensors.numpy import save_file
    ck = root / "ck"
    ck.mkdir()
    empty = np.zeros((2**40, 0), dtype=np.float32)
    names = ["decoder.layers.self_attention.linear_qkv.weight", "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
             "decoder.layers.self_attention.linear_proj.weight", "decoder.layers.mlp.linear_fc1.layer_norm_weight",
             "decoder.layers.mlp.linear_fc1.weight", "decoder.layers.mlp.linear_fc2.weight"]
    tensors = {n: empty for n in names}
    tensors["embedding.word_embeddings.weight"] = np.zeros((4, 2), dtype=np.float32)
    tensors["decoder.final_layernorm.weight"] = np.zeros((2,), dtype=np.float32)
    save_file(tensors, str(ck / "model.safetensors"))
    return ck, None, None


def stage_link_out(root, secret):
    """A pipeline stage that is a link out of the source: an error naming
    it, never a model of the other stages."""
    step = root / "step_3"
    copy_case("fsdp2_4ranks", step / "pp0")
    outside = root.parent / "elsewhere"
    copy_case("tp_shard1", outside)
    os.symlink(outside, step / "pp1")
    return step, "pp1", "leads out of the source"


def unknown_dtype(root, secret):
    """Every dtype a name torch does not have: rejected, naming the tensors,
    not shown as a checkpoint with no weights."""
    ck = copy_case("fsdp2_4ranks", root / "ck")
    md = (ck / ".metadata").read_bytes()
    assert md.count(b"float32") == 1
    (ck / ".metadata").write_bytes(md.replace(b"float32", b"float99"))
    return ck, ".metadata", "torch.float99"


# --- torch.save pytorch_model.bin archives (issue 24) ---------------------

def _pstr(s):
    b = s.encode()
    return b"X" + len(b).to_bytes(4, "little") + b


def _pint(n):
    if -2**31 <= n < 2**31:
        return b"J" + n.to_bytes(4, "little", signed=True)
    return b"\x8a\x08" + n.to_bytes(8, "little", signed=True)


def _ptuple(*xs):
    return b"(" + b"".join(_pint(x) for x in xs) + b"t"


def _tensor_pkl(numel, size, stride, key="0", offset=0):
    """A _rebuild_tensor_v2 call on FloatStorage key, as torch.save pickles it."""
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + b"(" + _pstr("storage") + b"ctorch\nFloatStorage\n" +
            _pstr(key) + _pstr("cpu") + _pint(numel) + b"tQ" + _pint(offset) + _ptuple(*size) +
            _ptuple(*stride) + b"\x89ccollections\nOrderedDict\n)RtR")


def _state_dict_pkl(*items):
    return b"\x80\x02}(" + b"".join(_pstr(k) + v for k, v in items) + b"u."


def _bin(path, pkl, storages=(("0", 16),), compression=None):
    """A torch.save archive at path: data.pkl and float storages of n bytes."""
    import zipfile
    with zipfile.ZipFile(path, "w", compression or zipfile.ZIP_STORED) as z:
        z.writestr("pytorch_model/data.pkl", pkl)
        z.writestr("pytorch_model/byteorder", b"little")
        for key, n in storages:
            z.writestr(f"pytorch_model/data/{key}", bytes(range(n % 256)) + b"\x00" * (n - n % 256))
        z.writestr("pytorch_model/version", b"3\n")


def _bin_case(root, pkl=None, **kw):
    ck = copy_case("torchsave_llama_tied", root / "ck")
    _bin(ck / "pytorch_model.bin", pkl or _state_dict_pkl(("w", _tensor_pkl(4, (2, 2), (2, 1)))), **kw)
    return ck


def _patch_central(path, entry, size):
    """Make the zip directory claim size bytes for entry."""
    data = bytearray(open(path, "rb").read())
    name = entry.encode()
    at = data.index(b"PK\x01\x02" + b"", data.index(b"PK\x01\x02"))
    while True:
        n = int.from_bytes(data[at + 28:at + 30], "little")
        if data[at + 46:at + 46 + n] == name:
            break
        at = data.index(b"PK\x01\x02", at + 4)
    data[at + 20:at + 24] = size.to_bytes(4, "little")
    data[at + 24:at + 28] = size.to_bytes(4, "little")
    open(path, "wb").write(bytes(data))


def torchsave_os_system(root, secret):
    """data.pkl calls os.system: decoded inertly, refused as not a state dict."""
    ck = _bin_case(root, b"\x80\x02cos\nsystem\n" + _pstr(f"cat {secret} > {root}/pwned") + b"\x85R.")
    return ck, "pytorch_model.bin", "os.system"


def torchsave_storage_past_eof(root, secret):
    ck = _bin_case(root)
    _patch_central(ck / "pytorch_model.bin", "pytorch_model/data/0", 1 << 30)
    return ck, "pytorch_model.bin", "past end of file"


def torchsave_huge_storage(root, secret):
    ck = _bin_case(root, _state_dict_pkl(("w", _tensor_pkl(1 << 58, (2, 2), (2, 1)))))
    return ck, "pytorch_model.bin", "storage \"0\""


def torchsave_overlapping_storages(root, secret):
    """Two entries whose claimed sizes add up to more than the file."""
    ck = _bin_case(root, storages=(("0", 16), ("1", 16)))
    size = os.path.getsize(ck / "pytorch_model.bin")
    for key in ("0", "1"):
        _patch_central(ck / "pytorch_model.bin", f"pytorch_model/data/{key}", size * 2 // 3)
    return ck, "pytorch_model.bin", "overlapping or huge entries"


def torchsave_compressed_records(root, secret):
    import zipfile
    ck = _bin_case(root, compression=zipfile.ZIP_DEFLATED)
    return ck, "pytorch_model.bin", "compressed"


def torchsave_entry_count_bomb(root, secret):
    """A zip64 end record claiming 2^40 directory entries: refused before
    anything is allocated for them."""
    ck = _bin_case(root)
    path = ck / "pytorch_model.bin"
    data = open(path, "rb").read()
    at = data.rindex(b"PK\x05\x06")
    eocd = bytearray(data[at:at + 22])
    cd_size, cd_off = int.from_bytes(eocd[12:16], "little"), int.from_bytes(eocd[16:20], "little")
    count = 1 << 40
    rec = (b"PK\x06\x06" + (44).to_bytes(8, "little") + bytes(4) + bytes(8) + count.to_bytes(8, "little") +
           count.to_bytes(8, "little") + cd_size.to_bytes(8, "little") + cd_off.to_bytes(8, "little"))
    loc = b"PK\x06\x07" + bytes(4) + at.to_bytes(8, "little") + (1).to_bytes(4, "little")
    eocd[8:12] = b"\xff\xff\xff\xff"
    open(path, "wb").write(data[:at] + rec + loc + bytes(eocd))
    return ck, "pytorch_model.bin", "entries"


# --- HF hub cache snapshots (issue 24): confined to their repo folder ----

HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_snapshot(hub, repo="models--org--tiny"):
    """testdata/plain_hf_single laid out as huggingface_hub does:
    blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>,
    refs/main (see test_hub.py). Returns the snapshot directory."""
    import hashlib
    folder = hub / repo
    snap = folder / "snapshots" / HUB_COMMIT
    for d in (folder / "blobs", folder / "refs", snap):
        d.mkdir(parents=True, exist_ok=True)
    src = TESTDATA / "plain_hf_single" / "ckpt"
    for name in sorted(os.listdir(src)):
        data = (src / name).read_bytes()
        etag = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / etag).write_bytes(data)
        os.symlink(f"../../blobs/{etag}", snap / name)
    (folder / "refs" / "main").write_text(HUB_COMMIT)
    return snap


def hub_snapshot_absolute_link(root, secret):
    snap = _hub_snapshot(root / "hub")
    os.remove(snap / "model.safetensors")
    os.symlink(secret, snap / "model.safetensors")
    return snap, "model.safetensors", "escapes the source tree"


def hub_blob_links_out(root, secret):
    """The snapshot's link stays in the repo, the blob it names leads out."""
    snap = _hub_snapshot(root / "hub")
    blob = snap.parent.parent / "blobs" / os.path.basename(os.readlink(snap / "model.safetensors"))
    os.remove(blob)
    os.symlink(os.path.relpath(secret, blob.parent), blob)
    return snap, "model.safetensors", "escapes the source tree"


def hub_other_repos_blob(root, secret):
    """A link to another repo's blob (of a cache outside the source)."""
    snap = _hub_snapshot(root / "hub")
    other = _hub_snapshot(root.parent / "otherhub", "models--other--repo")
    target = os.path.realpath(other / "model.safetensors")
    os.remove(snap / "model.safetensors")
    os.symlink(os.path.relpath(target, snap), snap / "model.safetensors")
    return snap, "model.safetensors", "escapes the source tree"


def legacy_missing_rank(root, secret):
    ck = copy_case("megatron_legacy_llama_tp2", root / "ck") / "iter_0000010"
    shutil.rmtree(ck / "mp_rank_01")
    return ck, "mp_rank_01/model_optim_rng.pt", "missing"


def deepspeed_missing_rank(root, secret):
    ck = copy_case("deepspeed_zero3_llama", root / "ck") / "global_step1"
    os.remove(ck / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    return ck, "zero_pp_rank_1_mp_rank_00_optim_states.pt", "missing"


def deepspeed_param_past_partitions(root, secret):
    ck = copy_case("deepspeed_zero2_llama", root / "ck") / "global_step1"
    shutil.copy(TESTDATA / "hostile" / "deepspeed_zero2_model_states_past.pt", ck / "mp_rank_00_model_states.pt")
    return ck, "mp_rank_00_model_states.pt", "runs past"


CASES = [symlinked_sidecar, symlinked_shard, fifo_file_index, fifo_megatron_config, fifo_metadata,
         corrupt_first_shard, directory_as_shard, truncated_shard, memo_bomb, zero_size_stacked,
         stage_link_out, unknown_dtype,
         torchsave_os_system, torchsave_storage_past_eof, torchsave_huge_storage, torchsave_overlapping_storages,
         torchsave_compressed_records, torchsave_entry_count_bomb,
         hub_snapshot_absolute_link, hub_blob_links_out, hub_other_repos_blob,
         legacy_missing_rank, deepspeed_missing_rank, deepspeed_param_past_partitions]


@pytest.mark.parametrize("make", CASES, ids=[c.__name__ for c in CASES])
def test_hostile(make, tmp_path, mount):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    src = tmp_path / "src"
    src.mkdir()
    ck, file, cause = make(src, secret)

    p, took, rss = run("inspect", ck)
    assert took < 30 and rss < 300, (took, rss)
    assert SECRET.decode() not in p.stdout + p.stderr
    if file is None:
        assert p.returncode == 0, p.stderr
    else:
        assert p.returncode != 0
        assert p.stderr.count("\n") == 1, p.stderr
        assert file in p.stderr and cause in p.stderr, p.stderr

    out = tmp_path / "out"
    p, took, rss = run("export", "--quiet", ck, out)
    assert took < 30 and rss < 300, (took, rss)
    if file is not None:
        assert p.returncode != 0 and file in p.stderr and p.stderr.count("\n") == 1, p.stderr
    for dirpath, _, names in os.walk(tmp_path):
        for n in names:
            f = os.path.join(dirpath, n)
            if f != str(secret) and os.path.isfile(f) and not os.path.islink(f):
                assert SECRET not in open(f, "rb").read(), f

    # One bad checkpoint never takes down the others: a good one beside it
    # serves its bytes after the bad one was listed and read.
    good = copy_case("sample", src / "good")
    m = mount(src)
    view = m.mnt / os.path.relpath(ck, src)
    start = time.monotonic()
    names = os.listdir(view)
    for n in names:
        if os.path.isfile(view / n):
            try:
                data = (view / n).read_bytes()
            except OSError:
                continue
            assert SECRET not in data, n
    assert time.monotonic() - start < 10
    if file is not None and cause != "past end of file":
        assert "CKPTFS_ERROR.txt" in names
        text = (view / "CKPTFS_ERROR.txt").read_text()
        assert file in text and cause in text, text
    served = (m.mnt / "good" / "model.safetensors").read_bytes()
    assert len(served) == os.path.getsize(m.mnt / "good" / "model.safetensors") > 0
    assert good.is_dir()


def test_verify_catches_a_flipped_byte(tmp_path, mount):
    """A bit flipped inside a tensor record: --verify (inspect, export and
    the mount) checks each record's CRC32 before serving any byte of it."""
    src = tmp_path / "src"
    ck = copy_case("fsdp2_4ranks", src / "ck")
    from safetensors.torch import load_file
    row = load_file(str(TESTDATA / "fsdp2_4ranks" / "expected.safetensors"))["emb.weight"][0]
    shard = ck / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    at = data.index(row.numpy().tobytes()) + 17  # inside rank 0's rows of emb.weight
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))

    p, _, _ = run("inspect", "--verify", ck)
    assert p.returncode != 0 and "CRC32 mismatch" in p.stderr and "__0_0.distcp" in p.stderr, p.stderr
    p, _, _ = run("export", "--quiet", "--verify", ck, tmp_path / "out")
    assert p.returncode != 0 and "CRC32 mismatch" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()

    m = mount(src, "--verify")
    with pytest.raises(OSError) as e:
        (m.mnt / "ck" / "model.safetensors").read_bytes()
    assert e.value.errno == 5  # EIO


def test_many_checkpoints_under_a_low_descriptor_limit(tmp_path, mount):
    """300 checkpoints read in turn by a mount limited to 256 descriptors
    (LimitNOFILE=256): views are evicted and reopened, so every one reads,
    twice, byte for byte (once, 60 read and the rest failed with EMFILE)."""
    src = tmp_path / "src"
    first = copy_case("sample", src / "c000")
    for i in range(1, 300):
        d = src / f"c{i:03d}"
        d.mkdir()
        for n in os.listdir(first):  # hard links: 300 directories, one set of bytes on disk
            os.link(first / n, d / n)
    m = mount(src, nofile=256)
    with open(f"/proc/{m.proc.pid}/limits") as f:
        assert any(l.startswith("Max open files") and l.split()[3] == "256" for l in f)
    want = None
    for _ in range(2):
        for i in range(300):
            data = (m.mnt / f"c{i:03d}" / "model.safetensors").read_bytes()
            want = want or data
            assert data == want, i
    assert len(os.listdir(f"/proc/{m.proc.pid}/fd")) < 256
