"""Where the time of a training step goes: a framework profiler's events reduced to the same few
categories in every notebook; no framework import. Also the two pieces of trace arithmetic several
notebooks share: own times of nested events (``self_times``), the map from a compiled XLA program's
operations to the framework operations they came from (``hlo_op_names``), and the events of the two trace
formats, read from the profilers' own objects without importing them (``jax_trace_events`` for a
``jax.profiler.ProfileData``, ``xspace_events`` for TensorFlow's ``XSpace`` protobuf).

A notebook profiles one training step with its framework's own profiler (torch.profiler, the
TensorFlow profiler, jax.profiler, MXNet's profiler; CNTK: timing by hand), lists the events as
``(name, seconds)`` -- self time, so nothing is counted twice -- and classifies them with its own
regular expressions (operator names are the framework's)::

    rules = [("convolution", r"conv"), ("rnn", r"rnn"), ("ctc", r"ctc"), ("batchnorm", r"batch_norm"),
             ("optimizer", r"sgd|momentum"), ...]
    record_profile = time_shares(events, rules, tool="torch.profiler", step_s=...)

The first rule that matches (``re.search``, case-insensitive) names an event's category;
unmatched events are ``other``, and the largest of them are listed so a reader can see what
``other`` holds.
"""
import re
from collections import OrderedDict
from typing import Iterable, List, Optional, Sequence, Tuple

#: the categories every notebook reports, in this order
CATEGORIES = ("convolution", "rnn_input", "rnn_recurrence", "rnn", "fc", "ctc", "batchnorm", "optimizer", "other")


def time_shares(events: Iterable[Tuple[str, float]], rules: Sequence[Tuple[str, str]], tool: str,
                step_s: Optional[float] = None, batch: Optional[dict] = None, top_other: int = 5) -> "OrderedDict":
    """Seconds and shares per category of ``events`` (name, self seconds) classified by ``rules``."""
    compiled = []  # type: List[Tuple[str, object]]
    for category, pattern in rules:
        if category not in CATEGORIES:
            raise ValueError("unknown profile category %r; categories: %s" % (category, ", ".join(CATEGORIES)))
        compiled.append((category, re.compile(pattern, re.IGNORECASE)))
    seconds = OrderedDict((c, 0.0) for c in CATEGORIES)
    other = {}
    for name, s in events:
        for category, rx in compiled:
            if rx.search(name):
                break
        else:
            category = "other"
            other[name] = other.get(name, 0.0) + float(s)
        seconds[category] += float(s)
    total = sum(seconds.values())
    shares = OrderedDict((c, (v / total if total else None)) for c, v in seconds.items())
    largest_other = sorted(other.items(), key=lambda kv: -kv[1])[:top_other]
    return OrderedDict([("tool", tool), ("step_s", step_s), ("profiled_s", total), ("batch", batch),
                        ("seconds", seconds), ("shares", shares),
                        ("largest_other", [[n, s] for n, s in largest_other])])


def self_times(events: Iterable[Tuple[str, float, float]], per_second: float = 1e9) -> List[Tuple[str, float]]:
    """(name, own seconds) of the nested events of one timeline, given as (name, start, duration) in units of
    which ``per_second`` make a second (1e9: nanoseconds; 1e12: picoseconds): an event's own time is its
    duration less its children's, so nothing is counted twice (a profiler's ``while`` loop contains its body's
    events, a layer its operators)."""
    out, stack = [], []                                  # type: List[Tuple[str, float]], list
    for name, start, duration in sorted(events, key=lambda e: (e[1], -e[2])):
        while stack and start >= stack[-1][1]:
            done = stack.pop()
            out.append((done[0], done[2] / per_second))
        if stack:
            stack[-1][2] -= duration
        stack.append([name, start + duration, duration])
    return out + [(name, own / per_second) for name, _, own in reversed(stack)]


def hlo_op_names(hlo_text: str) -> dict:
    """Each operation of a compiled XLA program (``compiled.as_text()``) -> the name of the framework
    operation it came from (its ``op_name`` metadata, which carries the ``jax.named_scope`` / Keras layer
    path). An operation without metadata of its own -- a fusion, a loop or a copy that a compiler pass made --
    takes, in this order: that of the computations it calls (``calls``, ``body``, ``to_apply``,
    ``called_computations``; each one's root, else its first named operation, following further calls), else
    that of its first operand that has one (a copy or layout change belongs to the operation whose value it
    moves). Only an operation with none of these stays unnamed ("")."""
    op_names, calls, operands, named_in, members, computation = {}, {}, {}, {}, {}, None
    order = []
    for line in hlo_text.splitlines():
        if " = " not in line and line.rstrip().endswith("{"):
            computation = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
            continue
        m = re.match(r'\s*(ROOT )?%([\w.\-]+) = (.*)', line)
        if m:
            root, name, rest = m.groups()
            order.append(name)
            members.setdefault(computation, []).append(name)
            called = re.findall(r'(?:calls|body|to_apply|condition)=%([\w.\-]+)', rest)
            for group in re.findall(r'(?:called_computations|branch_computations)=\{([^}]*)\}', rest):
                called += re.findall(r'%([\w.\-]+)', group)
            calls[name] = called
            args = re.search(r' [a-z][\w\-]*\(([^)]*)\)', rest)
            operands[name] = re.findall(r'%([\w.\-]+)', args.group(1)) if args else []
            meta = re.search(r'op_name="([^"]*)"', rest)
            if meta:
                op_names[name] = meta.group(1)
                if root or computation not in named_in:
                    named_in[computation] = meta.group(1)

    def through_calls(name, seen):
        for c in calls.get(name, []):
            if c in named_in:
                return named_in[c]
        for c in calls.get(name, []):            # a computation without names of its own: what it calls
            if c not in seen:
                seen.add(c)
                inner = next((found for found in (through_calls(n, seen) for n in members.get(c, [])) if found), "")
                if inner:
                    return inner
        return ""

    for name in order:                           # definitions come before uses: operands are settled first
        if not op_names.get(name):
            op_names[name] = through_calls(name, set()) or next(
                (op_names[o] for o in operands.get(name, []) if op_names.get(o)), "")
    return op_names


def jax_trace_events(planes, op_names: dict) -> List[Tuple[str, float]]:
    """(``"<hlo op> <framework op>"``, own seconds) of every XLA operation in a ``jax.profiler`` trace
    (``ProfileData.from_file(...).planes``): on a GPU the device's "XLA Ops" line, on a CPU the host's XLA
    thunks, where a loop's event contains its body's (own time: ``self_times``). ``op_names``: ``hlo_op_names``
    of the compiled step."""
    timelines = {}                                          # (plane, line) -> [(name, start_ns, duration_ns)]
    for plane in planes:
        for line in plane.lines:
            for e in line.events:
                hlo_op = dict(e.stats).get("hlo_op")
                if hlo_op and (plane.name.startswith("/host") or line.name == "XLA Ops"):
                    timelines.setdefault((plane.name, line.name), []).append(
                        ("%s %s" % (hlo_op, op_names.get(hlo_op, "")), e.start_ns, e.duration_ns))
    on_device = [k for k in timelines if k[0].startswith("/device")]
    return [e for k in (on_device or list(timelines)) for e in self_times(timelines[k])]


def xspace_events(space, on_gpu: bool, step_s: float) -> List[Tuple[str, float]]:
    """(name, own seconds) of the kernels in TensorFlow's profiler trace (an ``XSpace`` protobuf): on a GPU the
    device's kernels, named by the TensorFlow op that launched them; on a CPU the executor's kernels on the
    ``tf_Compute`` / ``tf_XLA`` threads (events ``node name:op type``, own time). An XLA program on a CPU leaves
    no per-kernel events: then the whole step (``step_s``) is one event that says so."""
    events = []
    for plane in space.planes:
        if on_gpu and plane.name.startswith("/device:GPU"):
            stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
            for line in plane.lines:
                for e in line.events:
                    op = [s.str_value for s in e.stats if stat_names.get(s.metadata_id) == "tf_op"]
                    events.append(((op[0] if op else "") + " " + plane.event_metadata[e.metadata_id].name,
                                   e.duration_ps / 1e12))
        elif not on_gpu and plane.name == "/host:CPU":
            for line in plane.lines:
                if line.name.startswith(("tf_Compute", "tf_XLA")):
                    timeline = [(plane.event_metadata[e.metadata_id].name, e.offset_ps, e.duration_ps)
                                for e in line.events]
                    events += [(n, s) for n, s in self_times(timeline, per_second=1e12)
                               if ":" in n and "::" not in n and s > 0]
    return events or [("XLA program (the whole step; the trace holds no per-kernel events)", step_s)]
