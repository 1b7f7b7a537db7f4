"""What an elastic run did, read back from the files its workers streamed into the run directory.

A run is a sequence of generations: one per world the rendezvous formed (``gen-000``, ``gen-001``, ...).
Each generation resumed from a checkpoint and completed some steps; a step counts as completed in a
generation when every rank of it recorded the step. When a later generation redoes a step (it resumed
from a checkpoint older than the failure), the later one is the step's final record: the final
history is what the model was actually trained on, and it is there that every sample of an epoch
must appear exactly once.

Between two generations is a transition, and its reason: a **failure** when the injected fault fired
in between (``--fail``) or a node of the old world is missing from the new one (killed from outside,
its machine lost: paralab never takes a node away on purpose); a **scale-out** when the world grew;
else a **restart**. A failure's detection time runs from the kill to the first survivor that noticed
(its error report), on the trace's clock, the one its figure (paralab.viz.elastic) draws: from the
``failure`` span to the first ``failure_detected`` span after it. For a failure from outside there is
no ``failure`` span and the moment of the kill is not known: it is measured on the wall clock, from the
lost rank's last sign of life (the end of its last recorded step) to the first survivor's error
report, so it may exceed the true figure by up to one step time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from paralab.elastic.config import ElasticConfig
from paralab.text import count_text, steps_said
from paralab.trace import EVENT, Counter, Span, Trace, typical_step_time


@dataclass
class Generation:
    name: str
    meta: dict
    steps: dict[int, dict]  # completed steps: step -> merged record
    errors: list[dict]  # survivors' reports: rank, t (when it noticed), error, traceback
    trace_lines: list[dict]
    last_seen: dict[int, float]  # rank -> end of its last recorded step (the world's start if none)


def _jsonl(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line cut short by a kill
            break
    return out


def read_generation(gen_dir: Path) -> Generation | None:
    meta_file = gen_dir / "meta.json"
    if not meta_file.exists():  # the world broke up before it resumed
        return None
    meta = json.loads(meta_file.read_text())
    by_step: dict[int, dict[int, dict]] = {}
    last_seen = {rank: meta["wall_start"] for rank in range(meta["world_size"])}
    for f in gen_dir.glob("rank*.steps.jsonl"):
        rank = _rank_of(f)
        for rec in _jsonl(f):
            by_step.setdefault(rec["step"], {})[rank] = rec
            last_seen[rank] = max(last_seen[rank], rec["t_end"])
    steps = {}
    for step, ranks in sorted(by_step.items()):
        if len(ranks) < meta["world_size"]:
            continue
        recs = [ranks[r] for r in sorted(ranks)]
        steps[step] = {
            "step": step, "world_size": meta["world_size"], "loss": sum(r["loss"] for r in recs),
            "generation": gen_dir.name, "sample_ids": [i for r in recs for i in r["ids"]],
            "ids_per_rank": [r["ids"] for r in recs],
            "compute_s": [r["compute_s"] for r in recs],
            "t_start": min(r["t_start"] for r in recs), "t_end": max(r["t_end"] for r in recs),
        }
    errors = [{"rank": _rank_of(f), **json.loads(f.read_text())}
              for f in sorted(gen_dir.glob("rank*.error.json"))]
    trace_lines = [line for f in sorted(gen_dir.glob("rank*.trace.jsonl")) for line in _jsonl(f)]
    return Generation(gen_dir.name, meta, steps, errors, trace_lines, last_seen)


def _rank_of(path: Path) -> int:
    """rankN.steps.jsonl, rankN.error.json -> N"""
    return int(path.name[4:].split(".")[0])


@dataclass
class ElasticResult:
    config: ElasticConfig
    generations: list[Generation]
    history: list[dict]  # the final record of each step, in step order
    transitions: list[dict]  # one per generation after the first: why and what it cost
    failure: dict | None
    trace: Trace
    own_agents: bool  # started by paralab elastic's agents (False: under a torchrun of one's own)
    trace_path: str | None = None

    @classmethod
    def collect(cls, cfg: ElasticConfig, run_dir: Path, own_agents: bool) -> ElasticResult:
        gens = [g for g in map(read_generation, sorted(run_dir.glob("gen-*"))) if g is not None]
        final: dict[int, dict] = {}
        for g in gens:  # later generations overwrite the steps they redid
            final.update(g.steps)
        history = [final[k] for k in sorted(final)]
        fault_file = run_dir / "fault.json"
        failure = json.loads(fault_file.read_text()) if fault_file.exists() else None
        # the ranks the launch could hold: the agents' MAX, or, where torchrun does not say it, the most
        # any world had
        world = cfg.max_nodes if own_agents else max((g.meta["world_size"] for g in gens), default=0)
        return cls(cfg, gens, history, _transitions(gens, failure), failure,
                   _merged_trace(cfg, gens, final, world, by_node=own_agents), own_agents)

    @property
    def losses(self) -> list[float]:
        return [h["loss"] for h in self.history]

    @property
    def summary(self) -> dict:
        cfg = self.config
        times = [h["t_end"] - h["t_start"] for h in self.history]
        return {
            "strategy": "elastic",
            "model": cfg.model_name,
            "steps": cfg.steps,
            "first_step": self.history[0]["step"] if self.history else None,
            "global_batch": cfg.global_batch,
            "micro_batch": cfg.micro_batch,
            # the agents' node range; under a torchrun of one's own, untold: torchrun does not say it
            "nnodes": f"{cfg.min_nodes}:{cfg.max_nodes}" if self.own_agents else None,
            "losses": self.losses,
            "world_sizes": [h["world_size"] for h in self.history],
            "sample_ids": [h["sample_ids"] for h in self.history],
            "samples_per_rank": [[len(ids) for ids in h["ids_per_rank"]] for h in self.history],
            "restarts": len(self.generations) - 1,
            "steps_redone": [t["steps_redone"] for t in self.transitions],
            "transitions": self.transitions,
            "failure": self.failure,
            "generations": [{"name": g.name, **g.meta, "completed_steps": sorted(g.steps)}
                            for g in self.generations],
            "step_time_s": typical_step_time({h["step"]: t for h, t in zip(self.history, times)}),
            "step_times_s": times,
            "balance": cfg.balance,
            "slow": cfg.slow,
            "join": joined(cfg, self.transitions),
            "trace": self.trace_path,
        }

    def save_trace(self, path: str | Path) -> str:
        """Write the merged trace in Chrome trace format (Perfetto draws the counters as tracks)."""
        self.trace_path = str(self.trace.save_chrome(path))
        return self.trace_path

    def describe(self) -> str:
        """``paralab elastic``'s text summary: the worlds, the losses, each rescaling and, with
        --balance, how each step's batch was split (what the balancer did)."""
        s = self.summary
        first = s["first_step"] or 0
        lines = [f"elastic training, model {s['model']}, {count_text(s['steps'], 'step')}, "
                 f"global batch {s['global_batch']}"
                 + (f"; resumed from a checkpoint: {steps_said(list(range(first, s['steps'])))} trained here"
                    if first else ""),
                 "world size per step: " + _runs(s["world_sizes"], first),
                 "losses: " + _some(f"{x:.4f}" for x in s["losses"])]
        for t in s["transitions"]:
            lines.append(f"{t['generation']}: {t['reason']}{_lost_text(t)}, "
                         f"world {t['world_size_before']} -> {t['world_size']}, "
                         f"resumed at step {t['resumed_at_step']}, "
                         f"{count_text(t['steps_redone'], 'step')} redone"
                         + (f", detected {seconds(t['detection_s'])} after it" if "detection_s" in t else "")
                         + (f", recovered {seconds(t['recovery_s'])} after detection"
                            if t.get("recovery_s") else ""))
        if s["join"] is not None:
            at = s["join"]["joined_at_step"]
            lines.append(f"the node asked to join after step {s['join']['after_step']}: "
                         + (f"joined, its world resumed at step {at}" if at is not None else
                            "had not joined when the last step ended (a short run can end before a new "
                            "node's workers start and meet the others)"))
        if s["balance"]:
            lines.append("samples per rank, step by step (split by measured throughput): "
                         + _some("/".join(map(str, split)) for split in s["samples_per_rank"]))
        lines.append(f"step time (median after the first): {s['step_time_s'] * 1e3:.1f} ms")
        if s["trace"]:
            lines.append(f"trace: {s['trace']} (open in https://ui.perfetto.dev)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"ElasticResult(steps={len(self.history)}, world_sizes={self.summary['world_sizes']}, "
                f"restarts={len(self.generations) - 1})")


def _lost_text(transition: dict) -> str:
    """Which node a failure took and how: " of node 0 (rank 0, injected by --fail)"."""
    if transition["reason"] != "failure":
        return ""
    node = transition["failed_node"]
    how = "injected by --fail" if transition["cause"] == "injected" else "lost from outside"
    where = f"node {node}" if node is not None else "a node"
    return f" of {where} (rank {transition['failed_rank']}, {how})"


SHOWN = 12  # values a line of the text lists before it shows the ends alone (--json has them all)


def _some(values) -> str:
    """Step by step, or, over :data:`SHOWN` steps, the first and last few: a cluster run's thousand
    losses had filled one line."""
    values = list(values)
    if len(values) <= SHOWN:
        return " ".join(values)
    half = SHOWN // 2
    return f"{' '.join(values[:half])} ... {' '.join(values[-half:])} ({len(values)} steps; --json: all)"


def _runs(sizes: list[int], first_step: int) -> str:
    """World sizes step by step, or, over :data:`SHOWN` steps, as runs: ``4 (steps 0-29), 2 (30-99)``."""
    if len(sizes) <= SHOWN:
        return " ".join(map(str, sizes))
    runs, first = [], 0
    for i in range(1, len(sizes) + 1):
        if i == len(sizes) or sizes[i] != sizes[first]:
            said = f"{first_step + first}-{first_step + i - 1}"
            runs.append(f"{sizes[first]} ({'steps ' if not runs else ''}{said})")
            first = i
    return ", ".join(runs)


def seconds(value: float, decimals: int = 1) -> str:
    """A duration as a reader takes it in: "12.6 s" (``decimals`` of a second), and under a second in
    milliseconds ("30 ms", where one decimal of a second had read "0.0 s")."""
    return f"{value:.{decimals}f} s" if abs(value) >= 0.9995 else f"{value * 1e3:.0f} ms"


def joined(cfg: ElasticConfig, transitions: list[dict]) -> dict | None:
    """What became of the node asked to join after step ``join_after_step``: the step the larger world
    resumed at, or None when the run ended first. None when no node was asked to join."""
    if cfg.join_after_step is None:
        return None
    scale_outs = [t["resumed_at_step"] for t in transitions if t["reason"] == "scale-out"]
    return {"after_step": cfg.join_after_step, "joined_at_step": scale_outs[0] if scale_outs else None}


def _transitions(gens: list[Generation], failure: dict | None) -> list[dict]:
    out = []
    for prev, gen in zip(gens, gens[1:]):
        before, after = prev.meta["world_size"], gen.meta["world_size"]
        last_done = max(prev.steps, default=prev.meta["start_step"] - 1)
        start = gen.meta["start_step"]
        injected = failure is not None and prev.meta["wall_start"] <= failure["t"] <= gen.meta["wall_start"]
        lost = [rank for rank, node in enumerate(prev.meta["nodes"]) if node not in gen.meta["nodes"]]
        reason = "failure" if injected or lost else "scale-out" if after > before else "restart"
        item = {"generation": gen.name, "reason": reason, "world_size_before": before, "world_size": after,
                "last_completed_step": last_done, "resumed_at_step": start,
                "checkpoint": gen.meta["checkpoint"], "steps_redone": max(0, last_done + 1 - start)}
        first = gen.steps.get(start)
        detected = min((e["t"] for e in prev.errors), default=None)
        if first is not None and detected is not None:
            item["recovery_s"] = first["t_end"] - detected  # detection to the first resumed step done
        if reason == "failure":
            rank, since = (failure["rank"], failure["t"]) if injected else (lost[0], prev.last_seen[lost[0]])
            item.update(failed_rank=rank, failed_node=prev.meta["nodes"][rank] if rank < before else None,
                        cause="injected" if injected else "node lost")
            traced = _traced_detection(prev, rank) if injected else None
            if traced is not None:
                item["detection_s"] = traced
            elif detected is not None:
                # the kill (or the last sign of life) to the first survivor noticing, on the wall clock
                item["detection_s"] = detected - since
        out.append(item)
    return out


def _traced_detection(gen: Generation, rank: int) -> float | None:
    """From rank ``rank``'s ``failure`` span to the first survivor's ``failure_detected`` span after it,
    on the generation's trace clock (ranks aligned when their clocks started); None without both.

    The wall-clock times of the fault marker and the error reports are taken a file write away from
    these spans (after the killed rank's trace flush, before a survivor's), so they read a few ms
    shorter than the figure drawn from the trace: one clock for both."""
    spans = [line["span"] for line in gen.trace_lines if "span" in line and line["span"]["lane"] == EVENT]
    kill = min((s["start"] for s in spans if s["kind"] == "failure" and s["rank"] == rank), default=None)
    if kill is None:
        return None
    noticed = [s["start"] for s in spans if s["kind"] == "failure_detected" and s["start"] >= kill]
    return min(noticed) - kill if noticed else None


def _merged_trace(cfg: ElasticConfig, gens: list[Generation], final: dict[int, dict], world: int,
                  by_node: bool) -> Trace:
    """All generations on one clock (the first generation's), with redone steps renamed and taken out
    of the step windows, so the trace's step metrics describe the final history.

    ``by_node`` (paralab elastic's own agents, one worker each, whose node number stays with it):
    each span and counter is filed under its worker's node, not the rank it had in its world, and the
    meta says so (``lanes: "node"``). Ranks are renumbered as a world re-forms: a lost node's lane had
    taken up the next world's rank 0 (another node's work) while a survivor's lane ended at the
    failure. Under a torchrun of one's own the lanes stay ranks: its node numbers (GROUP_RANK) are
    renumbered at each rendezvous too, and a node may run several workers."""
    t0 = gens[0].meta["wall_start"] if gens else 0.0
    traces = []
    for g in gens:
        shift = g.meta["wall_start"] - t0
        node = _node_of(g) if by_node else (lambda rank: rank)
        spans, counters = [], []
        for line in g.trace_lines:
            if "span" in line:
                s = Span(**line["span"])
                s = replace(s, rank=node(s.rank), start=s.start + shift, end=s.end + shift)
                if s.step is not None and final.get(s.step, {}).get("generation") != g.name:
                    s = replace(s, step=None, name=f"{s.name or s.kind} (redone later)")
                spans.append(s)
            else:
                c = Counter(**line["counter"])
                counters.append(replace(c, rank=node(c.rank), t=c.t + shift))
        traces.append(Trace(spans=spans, counters=counters))
        if by_node:
            world = max([world, *(n + 1 for n in g.meta.get("nodes") or [])])
    trace = Trace.merge(traces)
    m = cfg.model
    trace.meta.update({"source": "measured", "strategy": "elastic", "model": cfg.model_name,
                       "tokens_per_step": cfg.global_batch * m.seq_len, "world_size": world,
                       "generations": [{"name": g.name, **g.meta} for g in gens],
                       "step_records": _step_records(gens, final, t0),
                       "lanes": "node" if by_node else "rank"})
    return trace


def _node_of(gen: Generation):
    """A generation's rank -> its worker's node (the identity where its meta names no nodes)."""
    nodes = gen.meta.get("nodes") or []
    return lambda rank: nodes[rank] if 0 <= rank < len(nodes) and isinstance(nodes[rank], int) else rank


def _step_records(gens: list[Generation], final: dict[int, dict], t0: float) -> list[dict]:
    """Every step every world completed, in the order they ran (a redone step twice, ``final`` on the
    record the history keeps), with each rank's samples and compute seconds, times on the trace's
    clock: what the figures need that spans and counters do not hold (the balancer's shares)."""
    return [{"step": step, "generation": g.name, "world_size": rec["world_size"],
             "samples": [len(ids) for ids in rec["ids_per_rank"]], "compute_s": rec["compute_s"],
             "nodes": g.meta.get("nodes"),  # each rank's node, as an elastic trace's lanes are
             "start": rec["t_start"] - t0, "end": rec["t_end"] - t0,
             "final": final.get(step, {}).get("generation") == g.name}
            for g in gens for step, rec in sorted(g.steps.items())]
