"""An outage of a real S3-compatible server (moto, stopped with SIGSTOP so
that its connections hang, as a frozen store's do): the first lookup waits
out the retry budget once, every call after it during the outage fails at
once, and the outage is logged once as it begins and once as it ends
(issue 34.1: looking the same name up again waited the budget again, up to
twice over, with an ERROR line per retry chain)."""

import errno
import os
import re
import time

import pytest

from conftest import TESTDATA
from s3 import Moto


@pytest.fixture(scope="module")
def store():
    """s3://ckpts/run/step_1 holding the embedded sample checkpoint."""
    moto = Moto()
    old = dict(os.environ)
    os.environ.update(moto.env)
    try:
        c = moto.client()
        c.create_bucket(Bucket="ckpts")
        src = TESTDATA / "sample" / "ckpt"
        for f in os.listdir(src):
            c.upload_file(str(src / f), "ckpts", "run/step_1/" + f)
        yield moto
    finally:
        os.environ.clear()
        os.environ.update(old)
        moto.close()


def timed(call):
    start = time.time()
    try:
        call()
    except OSError as e:
        return time.time() - start, e.errno
    return time.time() - start, 0


def test_outage_is_remembered(store, mount):
    # One attempt of 2 s: a call that asks the frozen store fails in ~2 s.
    m = mount("s3://ckpts/run", "--read-timeout", "2s", "--max-attempts", "1")
    assert "step_1" in os.listdir(m.mnt)
    store.stop()
    try:
        time.sleep(1.5)  # the listing is kept a second
        took, err = timed(lambda: os.stat(m.mnt / "not-seen-0"))
        assert err == errno.EIO, err
        assert 1.5 < took < 5, f"the call that meets the outage took {took:.1f} s"
        for what, call in [("the same name", lambda: os.stat(m.mnt / "not-seen-0")),
                           ("another name", lambda: os.stat(m.mnt / "not-seen-1")),
                           ("a listing", lambda: os.listdir(m.mnt)),
                           ("a view file", lambda: os.stat(m.mnt / "step_1" / "model.safetensors"))]:
            took, err = timed(call)
            assert err == errno.EIO, (what, err)
            assert took < 0.5, f"{what} during the outage took {took:.1f} s"
    finally:
        store.cont()
    time.sleep(1.1)  # past the outage's retry interval: the next call asks
    assert "model.safetensors" in os.listdir(m.mnt / "step_1")
    log = m.output()
    errors = [line for line in log.splitlines() if "level=ERROR" in line]
    assert len(errors) == 1 and "source failing" in errors[0], log
    ends = re.findall(r'msg="source answers again" failed_calls=(\d+)', log)
    assert len(ends) == 1 and int(ends[0]) >= 4, log
