"""An HF hub cache snapshot directory, the one from_pretrained resolves to
and users copy-paste, works as SRC of inspect, export and mount: its files
are links into the repo folder's blobs/, and it is confined to that repo
folder (links that leave it stay refused, see test_hostile.py)."""

import filecmp
import hashlib
import os

from conftest import TESTDATA, ckptfs
from oracle import check_logits

CASE = "plain_hf_single"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(cache, repo_id="org/tiny", case=CASE, commit=COMMIT):
    """Lay testdata/<case>/ckpt out in the hub cache `cache` with
    huggingface_hub's own functions, as hf_hub_download does after a
    download (file_download.py, huggingface_hub 2.4: repo_folder_name;
    blobs/<etag>, the sha256 of an LFS file; _create_symlink, a relative
    link snapshots/<commit>/<file> -> ../../blobs/<etag>;
    _cache_commit_hash_for_specific_revision, refs/main). Returns the
    snapshot directory, as snapshot_download resolves it offline."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.file_download import (_cache_commit_hash_for_specific_revision, _create_symlink,
                                               _get_pointer_path, repo_folder_name)
    storage = os.path.join(cache, repo_folder_name(repo_id=repo_id, repo_type="model"))
    for name in sorted(os.listdir(TESTDATA / case / "ckpt")):
        data = (TESTDATA / case / "ckpt" / name).read_bytes()
        blob = os.path.join(storage, "blobs", hashlib.sha256(data).hexdigest())
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        with open(blob, "wb") as f:
            f.write(data)
        pointer = _get_pointer_path(storage, commit, name)
        os.makedirs(os.path.dirname(pointer), exist_ok=True)
        _create_symlink(blob, pointer, new_blob=True)
    _cache_commit_hash_for_specific_revision(storage, "main", commit)
    snap = snapshot_download(repo_id, cache_dir=str(cache), local_files_only=True)
    assert os.path.islink(os.path.join(snap, "model.safetensors"))
    assert os.readlink(os.path.join(snap, "model.safetensors")).startswith("../../blobs/")
    return snap


def test_inspect_export_snapshot(tmp_path):
    snap = hub_cache(tmp_path / "hub")
    p = ckptfs("inspect", snap, check=False)
    assert p.returncode == 0, p.stderr
    assert "lm_head.weight" in p.stdout or "model.embed_tokens.weight" in p.stdout, p.stdout
    out = tmp_path / "out"
    p = ckptfs("export", "--quiet", snap, out, check=False)
    assert p.returncode == 0, p.stderr
    # A plain safetensors model is shown as it is.
    assert filecmp.cmp(out / "model.safetensors", TESTDATA / CASE / "ckpt" / "model.safetensors", shallow=False)

    # The repo folder opens the snapshot its refs/main names.
    p = ckptfs("inspect", os.path.dirname(os.path.dirname(snap)), check=False)
    assert p.returncode == 0, p.stderr


def test_from_pretrained_through_mount_of_snapshot(tmp_path, mount):
    from transformers import AutoModelForCausalLM
    snap = hub_cache(tmp_path / "hub")
    m = mount(snap)
    names = os.listdir(m.mnt)
    assert "CKPTFS_ERROR.txt" not in names, (m.mnt / "CKPTFS_ERROR.txt").read_text()
    assert (m.mnt / "model.safetensors").read_bytes() == (TESTDATA / CASE / "ckpt" / "model.safetensors").read_bytes()
    model = AutoModelForCausalLM.from_pretrained(str(m.mnt)).eval()
    check_logits(model, CASE)
