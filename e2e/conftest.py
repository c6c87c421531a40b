"""Shared fixtures for the end-to-end tests: the built binary, and real
`ckptfs mount` processes serving a directory while the test process (the
client: safetensors, transformers, ls, cat) reads through the mount."""

import gc
import os
import pathlib
import signal
import subprocess
import sys
import time
import traceback

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTDATA = ROOT / "testdata"
BIN = os.environ.get("CKPTFS_BIN") or str(ROOT / "bin" / "ckptfs")


def ckptfs(*args, check=True, **kw):
    """Run the ckptfs binary and return the CompletedProcess."""
    return subprocess.run([BIN, *map(str, args)], check=check, capture_output=True, text=True, **kw)


def python(*args, **kw):
    """Run a Python fixture script (gloo ranks need USE_LIBUV=0); a failure
    raises with the end of its stderr, the only trace CI's log keeps."""
    r = subprocess.run([sys.executable, *map(str, args)], env={**os.environ, "USE_LIBUV": "0"},
                       capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{args[0]} exited {r.returncode}:\n{r.stderr[-4000:]}"
    return r


def held_under(mnt):
    """The files under mnt this process has open or mapped."""
    mnt = os.path.realpath(mnt) + "/"
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(mnt):
            held.add(f"fd {target}")
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(maxsplit=5)[5:]
            if path and path[0].strip().startswith(mnt):
                held.add(f"mapped {path[0].strip()}")
    return sorted(held)


def is_mounted(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == mnt for line in f)


class Mount:
    """A `ckptfs mount SRC MNT` process, ready when its stats file appears."""

    def __init__(self, src, mnt, *flags, nofile=None):
        """nofile: the mount's RLIMIT_NOFILE (soft and hard), as systemd's LimitNOFILE sets it."""
        self.src, self.mnt = pathlib.Path(src), pathlib.Path(mnt)
        self.stuck = None  # after close(): what held a mount that ignored SIGTERM
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.log = open(str(self.mnt) + ".log", "w+")

        def limit():
            if nofile is not None:
                import resource
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen([BIN, "mount", *map(str, flags), str(src), str(mnt)],
                                     stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=limit)
        deadline = time.time() + 30
        while not (self.mnt / ".ckptfs").exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptfs mount exited {self.proc.returncode}: {self.output()}")
            if time.time() > deadline:
                self.close()
                raise TimeoutError(f"mount not ready: {self.output()}")
            time.sleep(0.05)

    def exit_report(self):
        """Why the mount did not exit cleanly, short enough for CI's tail:
        its log before any SIGQUIT dump, the dump's goroutines that are busy
        in ckptfs code (the whole dump stays in the log file), and last what
        this process held under the mount."""
        log = self.output()
        dump = log.find("\nSIGQUIT")
        if dump >= 0:
            idle = ("[select", "[IO wait", "[sleep")  # workers and loops waiting for work
            ours = [g for g in log[dump:].split("\n\n")
                    if "ckptfs/ckptfs/" in g and not any(w in g.split("\n", 1)[0] for w in idle)]
            log = log[:dump][-2000:] + "\n[ckptfs goroutines of the dump]\n" + "\n\n".join(ours)[:6000]
        tail = f"ckptfs mount exited {self.proc.returncode} (whole log: {self.log.name})"
        if self.stuck is not None:
            tail += f"; still running 20 s after SIGTERM while this process held under the mount: {self.stuck or 'nothing'}"
        return f"{log[-8000:]}\n{tail}"

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log.name) as f:  # also after close(), for teardown's message
            return f.read()

    def close(self):
        self.stuck = None
        if self.proc.poll() is None:
            # A mount whose files are still open or mapped is detached and
            # served until they close: what this process holds names why.
            held = held_under(self.mnt)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.stuck = held
                # Go prints every goroutine's stack on SIGQUIT: the log
                # shows what the mount was stuck on.
                self.proc.send_signal(signal.SIGQUIT)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], check=False)
        self.log.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (the mount fixture's
    teardown reads it), and let go of what a failed test's frames held: a
    model loaded through a mount maps its view, and the mount it keeps busy
    would not exit cleanly. The report is written by then."""
    report = yield
    setattr(item, "report_" + report.when, report)
    if call.excinfo is not None:
        traceback.clear_frames(call.excinfo.tb)
    return report


@pytest.fixture
def mount(tmp_path, request):
    """Factory: mount(src, *flags) -> Mount; every mount is torn down after
    the test, and must exit cleanly unless the test failed already (its
    failure is the one to read)."""
    mounts = []

    def make(src, *flags, **kw):
        m = Mount(src, tmp_path / f"mnt{len(mounts)}", *flags, **kw)
        mounts.append(m)
        return m

    yield make
    gc.collect()  # models the test loaded through the mounts
    for m in mounts:
        m.close()
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        return
    for m in mounts:
        assert m.proc.returncode == 0, m.exit_report()
        assert not is_mounted(m.mnt)


def fixture_cases():
    """The committed torch-written fixtures (testdata/<case>/ckpt)."""
    return sorted(p.name for p in TESTDATA.iterdir() if (p / "ckpt").is_dir() and (p / "expected.safetensors").exists())


def case_info(case):
    """testdata/<case>/case.json."""
    import json
    return json.loads((TESTDATA / case / "case.json").read_text())


def fixture_views():
    """(case, view dir, format) for every directory of every fixture that is a
    checkpoint showing the case's expected tensors (case.json "views", default
    ckpt/)."""
    out = []
    for case in fixture_cases():
        info = case_info(case)
        for v in info.get("views") or [{"dir": "ckpt", "format": info["format"]}]:
            out.append(pytest.param(case, v["dir"], v["format"], id=f"{case}/{v['dir']}"))
    return out
