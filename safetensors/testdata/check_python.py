"""Prints, for each file argument, one JSON line saying whether the real
Python safetensors (safe_open, backed by the Rust crate) accepts it.
Used by TestPythonAgrees."""
import json
import sys

from safetensors import safe_open

for path in sys.argv[1:]:
    try:
        with safe_open(path, framework="np") as f:
            f.keys()
            f.metadata()
        print(json.dumps({"file": path, "ok": True}))
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"file": path, "ok": False, "error": str(e)}))
