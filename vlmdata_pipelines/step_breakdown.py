"""Where a training step's time goes, from torch.profiler's own events.

The trainer marks its phases with `record_function` ranges on the training thread
(`vlmdata.step#N` around the timed step, and `vlmdata.<phase>` inside it; see
vlmdata_pipelines/profiling.py). This module turns a profile into one number per phase so that the
phases PARTITION each step: every instant of `vlmdata.step#N` is given to exactly one phase,
so the phase seconds add up to the step time the profiler saw, which is the trainer's own
measured step time up to the profiler's bookkeeping.

Who gets an instant, in this order:

1. the training thread is inside a collective call (`c10d::*`, `gloo:*`, `nccl:*`) -> communication;
2. the training thread waits for data (`data_wait`, or the in-process `decode_stage` inside it);
3. a device (GPU) kernel or copy is running -> the phase whose range launched it;
4. a collective is in flight (another thread, or an NCCL kernel) while nothing computes: on a
   GPU, no compute kernel runs; on the CPU, the training thread has run no op for at least
   `min_wait_us` (it is blocked, e.g. DDP waiting for a gradient bucket) -> communication;
5. the innermost phase range of the training thread (vision_encoder and projector nest inside
   lm_forward, decode_stage inside data_wait);
6. anything else (bookkeeping between phases) -> other.

So "communication" is the EXPOSED communication: time the step spends waiting for it.
Communication hidden behind compute is reported separately (`comm_in_flight_seconds`), not as
a phase, since it costs no step time.
"""
from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["PHASES", "Breakdown", "ProfEvent", "StepTimeline", "attribute", "breakdown_from_events",
           "format_breakdown", "profiler_events", "timelines_from_events"]

# Phases in the order a step runs them; the last two come from rules 1/4 and 6 above.
PHASES = ("data_wait", "decode_stage", "h2d", "vision_encoder", "projector", "lm_forward", "backward",
          "optimizer", "communication", "other")
ANNOTATED = PHASES[:8]                  # phases marked by a `vlmdata.<phase>` range
WAITING = ("data_wait", "decode_stage")
ANNOTATION_PREFIX = "vlmdata."
STEP_PREFIX = "vlmdata.step#"
_STEP_RE = re.compile(r"^vlmdata\.step#(\d+)$")
_HOST_COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")

Interval = tuple[float, float]


@dataclass(frozen=True)
class ProfEvent:
    """One profiler event, as much of it as the breakdown reads (times in microseconds)."""

    name: str
    start: float
    end: float
    thread: int
    device: bool        # ran on a device (GPU kernel, copy, annotation mirror), not on a host thread
    id: int             # correlation id of a host op
    linked_id: int      # for device work: the correlation id of the host op that launched it
    kind: str = ""      # Kineto's activity type ("cpu_op", "user_annotation", "kernel", "gpu_memcpy", ...)


def profiler_events(prof) -> list[ProfEvent]:
    """A finished window's events: Kineto's raw events when this torch exposes them (an order of
    magnitude faster than building FunctionEvents), else `prof.events()`."""
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if raw is not None and hasattr(raw, "events"):
        out = []
        for e in raw.events():
            start = e.start_ns() / 1000
            out.append(ProfEvent(e.name(), start, start + e.duration_ns() / 1000, e.start_thread_id(),
                                 e.device_type().name != "CPU", e.correlation_id(), e.linked_correlation_id(),
                                 str(e.activity_type())))
        return out
    return [ProfEvent(e.name, e.time_range.start, e.time_range.end, e.thread,
                      getattr(e.device_type, "name", str(e.device_type)) != "CPU", e.id,
                      getattr(e, "linked_correlation_id", 0) or 0, str(getattr(e, "activity_type", "") or ""))
            for e in prof.events()]


@dataclass
class StepTimeline:
    """One step's intervals (microseconds, one clock), as the attribution needs them."""

    span: Interval
    phases: list[tuple[str, float, float]] = field(default_factory=list)  # training-thread phase ranges
    host_ops: list[Interval] = field(default_factory=list)    # other ops on the training thread
    host_comm: list[Interval] = field(default_factory=list)   # collective calls on the training thread
    comm: list[Interval] = field(default_factory=list)        # collectives in flight elsewhere (threads, NCCL)
    device: list[tuple[str, float, float]] = field(default_factory=list)  # device work, by launching phase


def _innermost(active: list[tuple[float, float, str]]) -> str | None:
    """The phase range that started last (ranges nest on one thread) among the active ones."""
    return max(active)[2] if active else None


def attribute(tl: StepTimeline, min_wait_us: float = 100.0) -> dict[str, float]:
    """Microseconds per phase (every key of PHASES); they add up to the span exactly."""
    lo, hi = tl.span
    out = dict.fromkeys(PHASES, 0.0)
    if hi <= lo:
        return out

    def clip(a: float, b: float) -> Interval | None:
        a, b = max(a, lo), min(b, hi)
        return (a, b) if b > a else None

    marks: dict[float, list[tuple[str, object, int]]] = {}

    def add(kind: str, key: object, a: float, b: float) -> None:
        iv = clip(a, b)
        if iv:
            marks.setdefault(iv[0], []).append((kind, key, +1))
            marks.setdefault(iv[1], []).append((kind, key, -1))

    for name, a, b in tl.phases:
        add("phase", (a, b, name), a, b)
    for kind, ivs in (("op", tl.host_ops), ("hcomm", tl.host_comm), ("comm", tl.comm)):
        for a, b in ivs:
            add(kind, None, a, b)
    for name, a, b in tl.device:
        add("dev", name, a, b)
    has_device = bool(tl.device)

    points = sorted(set(marks) | {lo, hi})
    active_phases: list[tuple[float, float, str]] = []
    count = {"op": 0, "hcomm": 0, "comm": 0}
    dev: dict[str, int] = {}
    segments = []  # (length, innermost phase, host idle, host comm, comm, device phase)
    for a, b in zip(points[:-1], points[1:]):
        for kind, key, delta in marks.get(a, ()):
            if kind == "phase":
                if delta > 0:
                    active_phases.append(key)
                else:
                    active_phases.remove(key)
            elif kind == "dev":
                dev[key] = dev.get(key, 0) + delta
            else:
                count[kind] += delta
        device_phase = next((p for p in PHASES if dev.get(p, 0) > 0), None)
        segments.append((b - a, _innermost(active_phases), count["op"] <= 0 and count["hcomm"] <= 0,
                         count["hcomm"] > 0, count["comm"] > 0, device_phase))

    # runs of consecutive idle segments of the training thread: long ones are waits
    long_idle = [False] * len(segments)
    i = 0
    while i < len(segments):
        if not segments[i][2]:
            i += 1
            continue
        j, total = i, 0.0
        while j < len(segments) and segments[j][2]:
            total += segments[j][0]
            j += 1
        if total >= min_wait_us:
            for k in range(i, j):
                long_idle[k] = True
        i = j

    for k, (length, phase, _idle, host_comm, comm, device_phase) in enumerate(segments):
        if host_comm:
            who = "communication"
        elif phase in WAITING:
            who = phase
        elif device_phase is not None:
            who = device_phase
        elif comm and (has_device or long_idle[k]):
            who = "communication"
        elif phase is not None:
            who = phase
        else:
            who = "other"
        out[who] += length
    return out


def _union_length(ivs: Iterable[Interval], lo: float, hi: float) -> float:
    total, end = 0.0, lo
    for a, b in sorted(ivs):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


@dataclass
class Breakdown:
    """A profiled window of steps: seconds per phase, summed over its steps."""

    rank: int
    steps: list[int]
    phase_seconds: dict[str, float]
    profiled_seconds: float          # the steps' spans as the profiler saw them
    measured_seconds: float          # the trainer's own step times for the same steps
    comm_in_flight_seconds: float    # collectives running at all (exposed + hidden behind compute)
    trace: str | None = None

    @property
    def total_seconds(self) -> float:
        return sum(self.phase_seconds.values())

    def shares(self) -> dict[str, float]:
        """Each phase's fraction of the measured step time."""
        base = self.measured_seconds or self.total_seconds or 1.0
        return {p: s / base for p, s in self.phase_seconds.items()}

    def to_dict(self) -> dict:
        return {"rank": self.rank, "steps": self.steps, "phase_seconds": self.phase_seconds,
                "shares": self.shares(), "total_seconds": self.total_seconds,
                "profiled_seconds": self.profiled_seconds, "measured_seconds": self.measured_seconds,
                "comm_in_flight_seconds": self.comm_in_flight_seconds, "trace": self.trace}


def _is_host_comm(name: str) -> bool:
    return name.startswith(_HOST_COMM_PREFIXES)


def _is_device_work(evt: ProfEvent) -> bool:
    """A kernel, copy or set on a device (not the annotation ranges Kineto mirrors on the GPU)."""
    kind = evt.kind.lower()
    if kind:
        return any(k in kind for k in ("kernel", "memcpy", "memset"))
    return not (evt.name.startswith(ANNOTATION_PREFIX) or evt.name.startswith("ProfilerStep"))


def timelines_from_events(events: Iterable[ProfEvent]) -> dict[int, StepTimeline]:
    """StepTimelines keyed by step number, from a profile's events (`profiler_events(prof)`).

    Needs the `vlmdata.step#N` ranges the trainer records; events of other steps are ignored.
    """
    events = sorted(events, key=_phases_first)  # host events (phase ranges) before the device work they launch
    steps: dict[int, StepTimeline] = {}
    main_thread = None
    for e in events:
        m = _STEP_RE.match(e.name)
        if m and not e.device:
            steps[int(m.group(1))] = StepTimeline(span=(e.start, e.end))
            main_thread = e.thread
    if not steps:
        return {}
    order = sorted(steps.items(), key=lambda kv: kv[1].span[0])
    starts = [tl.span[0] for _, tl in order]

    def overlapping(a: float, b: float) -> list[StepTimeline]:
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        out = []
        while i < len(order) and order[i][1].span[0] < b:
            if order[i][1].span[1] > a:
                out.append(order[i][1])
            i += 1
        return out

    host_start = {e.id: e.start for e in events if not e.device}
    for e in events:
        a, b, name = e.start, e.end, e.name
        if e.device:
            if not _is_device_work(e):
                continue
            if "nccl" in name.lower():
                for tl in overlapping(a, b):
                    tl.comm.append((a, b))
                continue
            launched = host_start.get(e.linked_id, a)
            for tl in overlapping(a, b):
                tl.device.append((_phase_at(tl, launched), a, b))
            continue
        if e.thread != main_thread:
            if _is_host_comm(name):
                for tl in overlapping(a, b):
                    tl.comm.append((a, b))
            continue
        if name.startswith(STEP_PREFIX) or name.startswith("ProfilerStep"):
            continue
        for tl in overlapping(a, b):
            if name.startswith(ANNOTATION_PREFIX) and name[len(ANNOTATION_PREFIX):] in ANNOTATED:
                tl.phases.append((name[len(ANNOTATION_PREFIX):], a, b))
            elif _is_host_comm(name):
                tl.host_comm.append((a, b))
            elif not name.startswith(ANNOTATION_PREFIX):
                tl.host_ops.append((a, b))
    return steps


def _phase_at(tl: StepTimeline, t: float) -> str:
    """The innermost training-thread phase around time t (a device op's launch), else "other".

    `timelines_from_events` is given host events first, so the step's phase ranges are complete here.
    """
    best = None
    for name, a, b in tl.phases:
        if a <= t < b and (best is None or a >= best[0]):
            best = (a, name)
    return best[1] if best else "other"


def breakdown_from_events(events: Iterable[ProfEvent], measured: Mapping[int, float], rank: int = 0,
                          trace: str | None = None, min_wait_us: float = 100.0) -> Breakdown | None:
    """The window's Breakdown: every profiled step that the trainer also measured; None if none."""
    timelines = timelines_from_events(events)
    steps = sorted(s for s in timelines if s in measured)
    if not steps:
        return None
    totals = dict.fromkeys(PHASES, 0.0)
    profiled = in_flight = 0.0
    for s in steps:
        tl = timelines[s]
        for p, us in attribute(tl, min_wait_us).items():
            totals[p] += us / 1e6
        lo, hi = tl.span
        profiled += (hi - lo) / 1e6
        in_flight += _union_length(tl.comm + tl.host_comm, lo, hi) / 1e6
    return Breakdown(rank=rank, steps=steps, phase_seconds=totals, profiled_seconds=profiled,
                     measured_seconds=sum(measured[s] for s in steps), comm_in_flight_seconds=in_flight,
                     trace=trace)


def _phases_first(e: ProfEvent) -> tuple[int, float]:
    """Sort key: host events (phase ranges among them) before device events, then by start."""
    return (1 if e.device else 0, e.start)


_LABELS = {"data_wait": "data wait", "decode_stage": "decode stage (in-process)", "h2d": "host-to-device copy",
           "vision_encoder": "vision encoder", "projector": "projector", "lm_forward": "language model forward",
           "backward": "backward", "optimizer": "optimizer (+ grad norm/clip)",
           "communication": "communication (exposed)", "other": "other (bookkeeping)"}


def format_breakdown(b: Breakdown) -> str:
    """A table: ms per step and share of the measured step time, for every phase."""
    n = max(len(b.steps), 1)
    shares = b.shares()
    first, last = b.steps[0] + 1, b.steps[-1] + 1  # numbered like the trainer's log lines
    span = f"{first}-{last}" if last > first else f"{first}"
    lines = [f"profile of step{'s' if n > 1 else ''} {span} (rank {b.rank}, {n} step{'s' if n > 1 else ''}"
             + (f", trace {b.trace}" if b.trace else "") + ")",
             f"  {'phase':<30} {'ms/step':>9} {'share':>7}"]
    for p in PHASES:
        lines.append(f"  {_LABELS[p]:<30} {1000 * b.phase_seconds[p] / n:9.1f} {100 * shares[p]:6.1f}%")
    total, measured = b.total_seconds, b.measured_seconds
    ratio = total / measured if measured else float("nan")
    lines.append(f"  {'sum of phases':<30} {1000 * total / n:9.1f} {100 * ratio:6.1f}%   "
                 f"measured step {1000 * measured / n:.1f} ms")
    hidden = max(b.comm_in_flight_seconds - b.phase_seconds["communication"], 0.0)
    lines.append(f"  communication in flight {1000 * b.comm_in_flight_seconds / n:.1f} ms/step, "
                 f"{1000 * hidden / n:.1f} ms of it hidden behind compute")
    return "\n".join(lines)
