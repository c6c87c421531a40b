"""`make demo`: mount the embedded sample checkpoint, list it, load every
tensor with safetensors (its numpy backend: no torch needed), compare with
the export, and unmount. numpy has no bfloat16, so the mount converts the
sample's bf16 tensors to fp32 on read (--dtype fp32), as the export did.

    python e2e/demo.py BIN SAMPLE_CKPT WORKDIR"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
from safetensors.numpy import load_file


def main(binary, sample, work):
    src = os.path.dirname(os.path.abspath(sample))
    name = os.path.basename(os.path.abspath(sample))
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    print(f"$ ckptfs mount --dtype fp32 {src} {mnt}")
    proc = subprocess.Popen([binary, "mount", "--dtype", "fp32", src, mnt])
    try:
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(mnt, ".ckptfs")):
            if proc.poll() is not None or time.time() > deadline:
                sys.exit("mount did not come up")
            time.sleep(0.05)
        view = os.path.join(mnt, name)
        print(f"$ ls -l {view}")
        subprocess.run(["ls", "-l", view], check=True)
        exported = os.path.join(work, "export")
        n = 0
        for f in sorted(os.listdir(view)):
            if f.endswith(".safetensors"):
                got, want = load_file(os.path.join(view, f)), load_file(os.path.join(exported, f))
                assert got.keys() == want.keys()
                for k in got:
                    assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
                    assert np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)), k
                n += len(got)
                del got, want  # safetensors maps the file: release it before unmounting
        print(f"loaded {n} tensors through the mount with safetensors; identical to the export")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    print("unmounted")


if __name__ == "__main__":
    main(*sys.argv[1:])
