"""Generate a bench checkpoint once: the one owner of the checkpoints the
bench sections keep across runs under WORK/src.

gen(work, name, script, *args) runs `python e2e/bench/SCRIPT OUT *args` and
returns OUT = WORK/src/NAME (a fixed path: sections mount WORK/src and
read the view NAME, and bench_clients.py reads WORK/src/llama). Its stamp
WORK/src/NAME.json names KEY, a hash of the script's name, its arguments
and the code (the syntax tree, without comments and docstrings) of the
script and of every module of e2e/bench or e2e it imports (transitively): a run with the same generator and arguments reuses
the checkpoint; a changed argument or source writes it anew, removing the
old one and its copies (NAME.xN).

Generation is atomic: the script writes into NAME.tmp-PID, renamed to NAME
when it exits 0, and only then is the stamp written (the script,
arguments, KEY, wall and CPU seconds, peak RSS of the generator and its
children). A checkpoint without its stamp, or whose stamp names another
KEY (a generator killed, a disk full, an older generator) is never reused:
gen() removes it and generates again. made(OUT) returns the stamp.
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


def code(path):
    """The source at path as its syntax tree, docstrings left out (as
    comments are): what the generator does, not what it says."""
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def key(script, args):
    """A checkpoint's KEY: a hash of the script's name, its arguments and
    the code of its sources."""
    h = hashlib.sha256(json.dumps([script, *args]).encode())
    for p in sources(script):
        h.update(b"\0" + os.path.relpath(p, HERE).encode() + b"\0" + code(p))
    return h.hexdigest()[:KEY_LEN]


def _remove(p):
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.remove(p)


def _stale(root, name):
    """Remove what is kept of name: the checkpoint, its stamp, copies and
    interrupted temporaries, and the layouts before this module
    (bench.gen's NAME.done, bench_scale.gen's NAME-KEY)."""
    mine = re.compile(re.escape(name) + r"(-[0-9a-f]{%d})?(\.x\d+(\.done)?|\.json(\.tmp)?|\.tmp-\d+|\.done)?$" % KEY_LEN)
    for e in os.listdir(root):
        if mine.match(e):
            _remove(os.path.join(root, e))


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
    out = os.path.join(root, name)
    try:
        if made(out)["key"] == k and os.path.isdir(out):
            return out
    except (OSError, ValueError, KeyError, TypeError):
        pass
    os.makedirs(root, exist_ok=True)
    _stale(root, name)
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
