#!/usr/bin/env python3
"""List the GPU architectures compiled into shared libraries: SASS (cubin) and PTX, per file.

    python tools/fatbin_archs.py LIBRARY.so [...]          # one line per file
    python tools/fatbin_archs.py --json LIBRARY.so [...]

Why not just ``cuobjdump --list-elf`` / ``--list-ptx``: NVIDIA's cuobjdump (on PyPI as
``nvidia-cuda-cuobjdump``, CUDA 13.x only) stops with "Support for 'sm_30' has been removed" on any
file that also carries Kepler code -- CNTK 2.7's libraries do -- and lists nothing.  This reads the
fat binaries itself.  Standard library only.

The format (not documented by NVIDIA; as read by cuobjdump and by open-source readers such as
gpuocelot and cuda_fatbin tools): a fat binary starts with the magic 0xBA55ED50 (little-endian
uint32), a uint16 version, a uint16 header size and a uint64 size of the entries that follow.  Each
entry starts with a uint16 kind (1 = PTX, 2 = ELF/SASS), a uint16, a uint32 header size, a uint64
payload size, ... and at byte 28 a uint32 architecture (70 = sm_70 / compute_70).  Checked against
cuobjdump 13.5 on mxnet-cu112 1.9.1's libmxnet.so (same counts per architecture; see
tests/test_preflight.py for the parser on a hand-made fat binary).
"""
import json
import mmap
import struct
import sys
from collections import Counter

MAGIC = struct.pack("<I", 0xBA55ED50)
KINDS = {1: "ptx", 2: "sass"}


def parse_fatbin(buf, offset):
    """Entries (kind, arch) of the fat binary at ``offset``, and its end; None when it is not one."""
    if len(buf) < offset + 16:
        return None
    magic, version, header_size, size = struct.unpack_from("<IHHQ", buf, offset)
    if magic != 0xBA55ED50 or version != 1 or header_size != 16 or size == 0 or offset + 16 + size > len(buf):
        return None
    entries = []
    pos, end = offset + 16, offset + 16 + size
    while pos + 32 <= end:
        kind, _, ehdr, esize = struct.unpack_from("<HHIQ", buf, pos)
        arch, = struct.unpack_from("<I", buf, pos + 28)
        if kind not in KINDS or ehdr < 32 or pos + ehdr + esize > end:
            return None
        entries.append((KINDS[kind], arch))
        pos += ehdr + esize
    return entries, end


def scan(data):
    """Every fat binary in ``data`` (bytes or mmap): Counter of (kind, arch)."""
    found = Counter()
    start = 0
    while True:
        i = data.find(MAGIC, start)
        if i < 0:
            return found
        parsed = parse_fatbin(data, i)
        if parsed is None:
            start = i + 4
            continue
        entries, end = parsed
        found.update(entries)
        start = end


def archs(path):
    """{"sass": [sm numbers], "ptx": [compute numbers], "entries": n} for one file."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:          # empty file
            return {"sass": [], "ptx": [], "entries": 0}
        try:
            found = scan(data)
        finally:
            data.close()
    return {"sass": sorted({a for k, a in found if k == "sass"}), "ptx": sorted({a for k, a in found if k == "ptx"}),
            "entries": sum(found.values())}


def describe(info):
    sass = ", ".join("sm_%d" % a for a in info["sass"]) or "-"
    ptx = ", ".join("compute_%d" % a for a in info["ptx"]) or "-"
    return "SASS: %s | PTX: %s | %d entries" % (sass, ptx, info["entries"])


def main(argv):
    as_json = "--json" in argv
    paths = [a for a in argv if a != "--json"]
    if not paths:
        print("usage: fatbin_archs.py [--json] LIBRARY [...]", file=sys.stderr)
        return 2
    out = {p: archs(p) for p in paths}
    if as_json:
        print(json.dumps(out, indent=1))
    else:
        for p, info in out.items():
            print("%s | %s" % (p, describe(info)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
