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
import os
import struct
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runner.validate import OneLineParser  # noqa: E402  (standard library only)

MAGIC = struct.pack("<I", 0xBA55ED50)
ELF_MAGIC = b"\x7fELF"
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


def path_error(path):
    """Why ``path`` cannot be read as a library, or None: a regular file that opens, and an ELF file (a shared
    library, an object file) or a fat binary by its first bytes."""
    if not path.strip():
        return "%r is empty: an empty path names no library" % path
    if not os.path.exists(path):
        return "%s: no such file" % path
    if not os.path.isfile(path):
        return "%s is not a regular file (a directory or a device); name a shared library" % path
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return "%s cannot be read: %s" % (path, e.strerror or e)
    if head not in (ELF_MAGIC, MAGIC):
        return "%s is neither an ELF file (a shared library) nor a fat binary: its first bytes are %r" % (path, head)
    return None


def main(argv):
    p = OneLineParser(prog="fatbin_archs.py", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON: {path: {sass, ptx, entries}}")
    p.add_argument("paths", nargs="*", metavar="LIBRARY", help="shared libraries (regular files) to read")
    args = p.parse_args(argv)       # an unknown option is named before a missing LIBRARY
    if not args.paths:
        p.error("no LIBRARY given: usage: fatbin_archs.py [--json] LIBRARY [...]")
    problem = next((e for e in map(path_error, args.paths) if e), None)
    if problem:
        p.error(problem)
    out = {path: archs(path) for path in args.paths}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for path, info in out.items():
            print("%s | %s" % (path, describe(info)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
