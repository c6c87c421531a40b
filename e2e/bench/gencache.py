"""Generate a bench checkpoint once: the one owner of the checkpoints the
bench sections keep across runs under WORK/src.

gen(work, name, script, *args) runs `python e2e/bench/SCRIPT OUT *args` and
returns OUT = WORK/src/NAME-KEY, KEY a hash of the script's name, its
arguments and the source of the script and of every module of e2e/bench or
e2e it imports (transitively): a run with the same generator and arguments
reuses the checkpoint; a changed argument or source writes it anew, and
removes the kept ones of NAME it replaces (with their copies NAME-KEY.xN).

Generation is atomic: the script writes into NAME-KEY.tmp-PID, renamed to
NAME-KEY when it exits 0, and only then is the stamp NAME-KEY.json written
(the script, arguments, wall and CPU seconds, peak RSS of the generator and
its children). A checkpoint without its stamp (a generator killed, a disk
full) is never reused: the next gen() removes it and generates again.
made(OUT) returns the stamp.
"""

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Where a generator's own modules live: e2e/bench, and e2e (models.py).
SEARCH = (HERE, os.path.dirname(HERE))
KEY_LEN = 12


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def local_imports(path):
    """The files of SEARCH that the Python source at path imports."""
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    out = set()
    for n in names:
        for d in SEARCH:
            p = os.path.join(d, n + ".py")
            if os.path.isfile(p):
                out.add(p)
                break
    return out


def sources(script):
    """The script and every local module it imports, transitively, sorted."""
    seen, todo = set(), [os.path.join(HERE, script)]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += local_imports(p)
    return sorted(seen)


def key(script, args):
    """The hash naming a checkpoint: the script's name, its arguments and
    the bytes of its sources."""
    h = hashlib.sha256(json.dumps([script, *args]).encode())
    for p in sources(script):
        h.update(b"\0" + os.path.relpath(p, HERE).encode() + b"\0")
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:KEY_LEN]


def _remove(p):
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.remove(p)


def _stale(root, name, keep):
    """Remove what gen() kept of name other than keep: other keys, their
    copies and stamps, interrupted temporaries (and the checkpoint bench.gen
    kept as WORK/src/NAME with its NAME.done, before this module)."""
    mine = re.compile(re.escape(name) + r"-[0-9a-f]{%d}(\.x\d+(\.done)?|\.json(\.tmp)?|\.tmp-\d+)?$" % KEY_LEN)
    entries = os.listdir(root)
    for e in entries:
        if e != keep and mine.match(e):
            _remove(os.path.join(root, e))
    if name + ".done" in entries:
        _remove(os.path.join(root, name))
        _remove(os.path.join(root, name + ".done"))


def made(out):
    """The stamp of a checkpoint gen() returned."""
    with open(out + ".json") as f:
        return json.load(f)


def gen(work, name, script, *args, env=None):
    """The checkpoint SCRIPT writes with ARGS, generated once under
    WORK/src (see the module doc); its path."""
    args = [str(a) for a in args]
    k = key(script, args)
    root = os.path.join(work, "src")
    base = f"{name}-{k}"
    out = os.path.join(root, base)
    if os.path.isfile(out + ".json") and os.path.isdir(out):
        return out
    os.makedirs(root, exist_ok=True)
    _stale(root, name, keep=None)
    tmp = f"{out}.tmp-{os.getpid()}"
    log(f"generating {name} ({script} {' '.join(args)}) ...")
    t = time.perf_counter()
    # The generator's stdout goes to stderr: a bench's stdout is its
    # results (bench_scale.py prints its rows there as JSON).
    p = subprocess.Popen([sys.executable, os.path.join(HERE, script), tmp, *args], stdout=2,
                         env={**os.environ, "USE_LIBUV": "0", **(env or {})})
    try:
        _, status, ru = os.wait4(p.pid, 0)
    except BaseException:
        p.kill()
        p.wait()
        _remove(tmp)
        raise
    wall = time.perf_counter() - t
    if status != 0:
        _remove(tmp)
        raise RuntimeError(f"{script} {' '.join(args)}: generation failed (wait status {status}); nothing kept")
    if not os.path.isdir(tmp):
        raise RuntimeError(f"{script} {' '.join(args)}: exited 0 without writing {tmp}")
    os.rename(tmp, out)
    stamp = dict(script=script, args=args, key=k, wall_s=round(wall, 1),
                 cpu_s=round(ru.ru_utime + ru.ru_stime, 1), peak_MiB=round(ru.ru_maxrss / 1024))
    with open(out + ".json.tmp", "w") as f:
        json.dump(stamp, f)
    os.replace(out + ".json.tmp", out + ".json")
    return out
