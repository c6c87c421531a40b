"""Writes the pickles the Go tests decode: python3 gen.py (any CPython 3.8+)."""
import collections
import pickle


class Plain:
    def __init__(self):
        self.x = 1
        self.name = "plain"


class Slots:
    __slots__ = ("a",)

    def __init__(self):
        self.a = 7


class TupleState:
    def __getstate__(self):
        return (1, "two")

    def __setstate__(self, s):
        pass


class Reduced:
    def __reduce__(self):
        return (Reduced, ("arg", 3))


class KwNew:
    def __new__(cls, *args, **kw):
        return object.__new__(cls)

    def __getnewargs_ex__(self):
        return ((1,), {"k": "v"})


class MyList(list):
    pass


def values():
    shared = [1, 2]
    d = {
        "a": 1,
        "b": [1, 2.5, "x", b"by", None, True, False],
        "t": (1, (2, 3)),
        "big": 2**70,
        "neg": -(2**40),
        "i32": -5,
        "u16": 65535,
        "s": {1},
        "fs": frozenset([3]),
        5: "intkey",
        (1, "k"): "tuplekey",
        "ba": bytearray(b"q"),
        "long": "x" * 300,
        "od": collections.OrderedDict(a=1),
        "shared": [shared, shared],
        "empty": (),
    }
    return d


def objects():
    ml = MyList()
    ml.append(4)
    return [Plain(), Slots(), TupleState(), Reduced(), KwNew(), ml]


for proto in (2, 3, 4, 5):
    with open(f"values_p{proto}.pkl", "wb") as f:
        pickle.dump(values(), f, protocol=proto)
with open("objects_p4.pkl", "wb") as f:
    pickle.dump(objects(), f, protocol=4)
with open("objects_p2.pkl", "wb") as f:
    pickle.dump(objects(), f, protocol=2)
