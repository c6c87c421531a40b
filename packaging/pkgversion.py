"""The version of a package, from `git describe --tags --always --dirty`
(what `make` stamps into the binary): PEP 440 for the wheel, Debian's
form for the .deb. A describe with no tag (a bare commit) is 0.0.0 plus
the commit, so that every build has a version both tools accept and that
sorts below the first release.

    python3 pkgversion.py pep440|deb DESCRIBE"""

import re
import sys

_DESCRIBE = re.compile(r"^v?(\d+(?:\.\d+)+)(?:-(\d+)-g([0-9a-f]+))?(-dirty)?$")


def parse(describe):
    """(release, commits since it, commit, dirty) of a describe."""
    m = _DESCRIBE.match(describe)
    if m:
        return m.group(1), int(m.group(2) or 0), m.group(3) or "", bool(m.group(4))
    m = re.match(r"^([0-9a-f]{4,40})(-dirty)?$", describe)
    if m:
        return "0.0.0", 0, m.group(1), bool(m.group(2))
    raise ValueError(f"unrecognised version {describe!r}: want vX.Y.Z[-N-gSHA][-dirty] or SHA[-dirty]")


def pep440(describe):
    release, n, sha, dirty = parse(describe)
    v = release + (f".post{n}" if n else "")
    local = ".".join(p for p in (("g" + sha) if sha and (n or release == "0.0.0") else "", "dirty" if dirty else "") if p)
    return v + ("+" + local if local else "")


def deb(describe):
    release, n, sha, dirty = parse(describe)
    v = release
    if sha and (n or release == "0.0.0"):
        v += f"+{n}.g{sha}" if n else f"~git{sha}"
    return v + ("+dirty" if dirty else "")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("pep440", "deb"):
        sys.exit(__doc__)
    print({"pep440": pep440, "deb": deb}[sys.argv[1]](sys.argv[2]))
