"""Human-readable output: the offline commands (plan, catalog, stack), the run's plan summary and
prompt, and the run tables of status/ls. Tables on stdout, warnings and prompts on stderr. Kept out
of cli.py and the lifecycle so those stay thin; the tables are plain text (ui/table.py), no rich."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpucloud.prose import fill, output_width, to_stderr
from gpucloud.ui.progress import fmt_seconds
from gpucloud.ui.table import Table

if TYPE_CHECKING:
    from gpucloud.catalog.models import Offering
    from gpucloud.contract.provider import Candidate
    from gpucloud.plan.planner import Plan
    from gpucloud.plan.stacks import Stack
    from gpucloud.state.runs_db import ResourceRecord, RunRecord
    from gpucloud.ui.catalog import GpuSummary

PLAN_ROWS = 10
EXCLUDED_ROWS = 8  # groups of exclusions shown without --all
GROUPED_SCAN = 500  # exclusions read to group them without --all (a catalog of every region is large)
RIGHT = ("$", "GPUs", "vCPU", "GiB", "est")  # right-justified: the columns whose header starts so


def _table(*columns: str, title: str | None = None) -> Table:
    """A table whose numeric columns (prices, counts, sizes, estimates) are right-justified."""
    return Table(*columns, title=title, right=tuple(c for c in columns if c.startswith(RIGHT)))


def _print(
    table: Table,
    *,
    optional: tuple[str, ...] = (),
    foldable: tuple[str, ...] = (),
    last_resort: tuple[str, ...] = (),
) -> None:
    """Print a table within the output width: short values (names, instance types, prices) stay
    whole, headers and long texts wrap; when even that does not fit, the `optional` columns are left
    out, in that order, and named on stderr; then the `last_resort` columns fold. A table that
    still does not fit is printed wider rather than cut (Table.fit, Table.lines)."""
    width = output_width()
    _emit(table, table.fit(width, optional, foldable=foldable, last_resort=last_resort), width)


def _emit(table: Table, hidden: list[str], width: int) -> None:
    """A fitted table on stdout; the columns it left out named on stderr."""
    if hidden:
        note(f"(narrow terminal: column(s) {', '.join(hidden)} not shown; --json has every field)")
    lines = table.lines(width)
    if lines:
        print("\n".join(lines))


def say(text: str) -> None:
    """A line of prose on stdout, wrapped to the output width like the tables."""
    print(fill(text, output_width()))


def note(text: str) -> None:
    """A note or warning on stderr, wrapped to the width of the terminal it goes to (80 columns
    when stderr is not a terminal); long words (paths, URLs, commands) are never broken."""
    to_stderr(text)


def _warn(lines: list[str] | tuple[str, ...]) -> None:
    for line in lines:
        note(f"warning: {line}")


def print_plan(plan: Plan, *, show_all: bool = False, all_reasons: bool = False) -> None:
    """The candidates, the stack and the exclusions (grouped; `all_reasons`: each row with its full
    reason). What plan is for (market, $/h, est. $) is the last to give way on a narrow terminal:
    the host CPU (arch), position, GPU count, region and then cloud columns go first."""
    spec = plan.spec
    hours = spec.max_duration / 3600
    say(f"Candidates for {spec.name} (failover order; est. $ for max_duration {hours:.3g} h)")
    shown = plan.candidates if show_all else plan.candidates[:PLAN_ROWS]
    _print_marked(
        lambda mark: _candidates_table(plan, shown, mark=mark),
        optional=("arch", SOURCE, "$/h\nper node", "#", "request", "GPUs", "fabric", "region", "cloud"),
    )
    if len(plan.candidates) > len(shown):
        say(f"... and {len(plan.candidates) - len(shown)} more candidates (--all lists them, --json gives everything)")
    if plan.container is not None:
        _print_container(plan.container.as_json())
    else:
        print_stack(plan.stack, brief=True)
    if len(plan.stacks) > 1:  # GPU alternatives: the stack shown is #1's
        note(f"the stack above is #1's ({shown[0].gpu}); each GPU gets its own (--json: stacks)")
    if shown and shown[0].image is not None:  # the image the first candidate boots
        say(f"image (#1): {shown[0].image.summary()}")
    _print_exclusions(plan, show_all=show_all, all_reasons=all_reasons)
    from gpucloud.ui.plan_notes import price_ages

    age = plan.data.warning if plan.data is not None else None
    _warn([w for w in plan.warnings if w != age] + price_ages(shown, plan.data))
    for line in plan.notes:
        note(f"note: {line}")


SOURCE = "price\nsource (age)"


def _candidates_table(plan: Plan, shown: Sequence[Candidate], *, mark: bool) -> Table:
    """The candidates; `mark`: an estimated or old price says so in its market cell (when the
    price source column that says it is not shown: said once, not twice)."""
    from gpucloud.plan.fabric import candidate_fabric  # between the nodes: EFA, InfiniBand or TCP
    from gpucloud.ui.plan_notes import source_cell  # a table of prices only

    per_node = plan.spec.num_nodes > 1
    several = len(plan.requests()) > 1  # alternatives: which request each meets
    table = _table(
        "#",
        "cloud",
        "region",
        "instance type",
        "GPUs",
        "arch",
        *(("request",) if several else ()),
        "market",
        *(("fabric",) if per_node else ()),
        *(("$/h\nper node",) if per_node else ()),
        "$/h\ntotal" if per_node else "$/h",
        "est. $",
        SOURCE,
    )
    for i, c in enumerate(shown, 1):
        market = "spot" if c.spot else "on-demand"
        if c.status != "active":
            market += f"\n[{c.status}]"
        if mark and c.price_source is not None and c.price_source.kind in ("estimate", "old"):
            market += f"\n({c.price_source.kind} price)"  # never passed off as a quote (no [..]: markup)
        prices = (candidate_fabric(c) or "-", f"{c.price_per_hour:.3f}") if per_node else ()
        table.add_row(
            str(i),
            c.cloud,
            c.region,
            c.instance_type,
            f"{c.gpu_count} × {c.gpu}" if c.gpu else "-",
            c.arch,
            *((c.request,) if several else ()),
            market,
            *prices,
            f"{c.total_per_hour:.3f}",
            f"{c.estimated_cost:.2f}",
            source_cell(c.price_source),
        )
    return table


def _print_marked(build: Callable[[bool], Table], *, optional: tuple[str, ...], foldable: tuple[str, ...] = ()) -> None:
    """A table whose estimated prices are marked in their own cells only when the price source
    column (which names them) gives way on a narrow terminal."""
    width = output_width()
    table = build(False)
    hidden = table.fit(width, optional, foldable=foldable)
    if SOURCE.replace("\n", " ") in hidden:
        table = build(True)
        hidden = table.fit(width, optional, foldable=foldable)
    _emit(table, hidden, width)


def _print_exclusions(plan: Plan, *, show_all: bool, all_reasons: bool) -> None:
    """Why the closest offerings are not candidates: grouped by cloud, instance family and reason,
    or (`all_reasons`) every row with its full reason and sources."""
    from gpucloud.plan.rows import listed_exclusions
    from gpucloud.ui.plan_notes import group_exclusions

    hidden = ("has ", "cloud ", "instance type is not")
    if all_reasons:
        rows, relevant = listed_exclusions(plan.excluded, hidden, None)
        ex = _table("cloud", "region", "instance type", "why excluded")
        for e in rows:
            ex.add_row(e.cloud, e.region, e.instance_type, e.reason)
        _print(ex, foldable=("why excluded",), optional=("region", "cloud"))
    else:
        rows, relevant = listed_exclusions(plan.excluded, hidden, None if show_all else GROUPED_SCAN)
        groups = group_exclusions(rows)
        listed = groups if show_all else groups[:EXCLUDED_ROWS]
        ex = _table("cloud", "GPU, instance type", "where", "why excluded")
        gpus = _gpus_of([(g.cloud, g.types[0]) for g in listed])
        for g in listed:
            gpu = gpus.get((g.cloud, g.types[0]))
            ex.add_row(g.cloud, f"{gpu} {g.instance_types()}" if gpu else g.instance_types(), g.where(), g.why())
        _print(ex, foldable=("why excluded",), optional=("where", "cloud"))
        if len(groups) > len(listed) or relevant > len(rows):
            say("... more exclusions (--all lists every group)")
        if len(groups) < relevant:
            say(f"{relevant} excluded offerings in {len(groups)} groups; --all-reasons lists each with its full reason")
    other = len(plan.excluded) - relevant
    if other:
        say(f"{other} offerings of other GPUs, counts or clouds not shown (--json lists every one with its reason)")


def _gpus_of(types: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The GPU of each (cloud, instance type), from the catalog (a group names it: "K80 p2.*")."""
    from gpucloud.catalog import load_catalog
    from gpucloud.catalog.rows import RowFilter

    rows = load_catalog().rows
    out: dict[tuple[str, str], str] = {}
    for cloud, itype in dict.fromkeys(types):
        found = rows.select(RowFilter(clouds=frozenset((cloud,)), instance_type=itype), 1)
        if found and found[0][1].gpu:
            out[(cloud, itype)] = found[0][1].gpu
    return out


def _print_container(doc: dict[str, Any]) -> None:
    """A container job: the image and its CUDA (and where that came from), then the host stack of
    candidate #1's machine and why; the image brings CUDA, cuDNN and the framework."""
    cuda = f"CUDA {doc['cuda']} ({doc['cuda_source']}: {doc['cuda_detail']})" if doc["cuda"] else "CUDA unknown"
    say(f"Container: {doc['image']}, {cuda}")
    host = doc["host_stack"]
    say(f"Host stack (#1): driver {host['driver']}; engine: {host['engine']}; toolkit: {host['toolkit']}")
    why = host.get("why")
    for key, text in why.items() if isinstance(why, dict) else (("why", why),):
        say(f"  {key}: {text}")


def catalog_rows(*, gpu: str | None, cloud: str | None, region: str | None, include_retired: bool) -> list[Offering]:
    """Catalog query with the same friendly errors as the job file for unknown names."""
    from gpucloud.catalog import load_catalog, resolve_gpu_name
    from gpucloud.contract import registry as providers
    from gpucloud.errors import UserError

    cat = load_catalog()
    model = None
    if gpu:
        model = resolve_gpu_name(gpu)
        if model is None:
            raise UserError(f"--gpu {gpu!r} is not a GPU gpucloud knows.", hint=_gpu_hint(gpu))
    if region and (cloud is None or providers.info(cloud).priced):
        known = {c: cat.regions(c) for c in ([cloud] if cloud else providers.priced_clouds())}
        if not any(region in rs for rs in known.values()):
            from gpucloud.catalog.regions import unknown_region

            raise unknown_region(region, "--region", known)
    rows = cat.query(gpu=model, cloud=cloud, region=region, include_retired=include_retired)
    return sorted(rows, key=lambda o: (o.gpu, o.cloud, o.price_per_hour, o.region))


def _gpu_hint(name: str) -> str:
    import difflib

    from gpucloud.catalog import gpu_names

    names = gpu_names()
    close = difflib.get_close_matches(name.upper(), names, n=3, cutoff=0.5)
    lead = f"Did you mean {', '.join(close)}? " if close else ""
    return f"{lead}Known GPUs: {', '.join(names)}."


def print_catalog(rows: list[Offering]) -> None:
    """Offerings; on a narrow terminal memory, vCPUs, the region and then the cloud give way before
    the status, so a retired row never looks buyable (the status wraps instead). An estimated or
    old price is marked `*` only when the price source column that names it is not shown."""
    gpus = sorted({o.gpu for o in rows})
    if len(gpus) == 1:  # one GPU (--gpu): say it once in the title instead of on every row
        say(f"Offerings of {gpus[0]}")
    all_active = all(o.status == "active" for o in rows)
    _print_marked(
        lambda mark: _catalog_table(rows, mark=mark),
        foldable=("status",),
        optional=(
            SOURCE,
            *(("status",) if all_active else ()),
            "GiB",
            "vCPU",
            *(("GPU",) if len(gpus) == 1 else ()),
            "region",
            "cloud",
            "$/h\nspot",
        ),
    )
    if not rows:
        note("no offerings match (retired ones appear with --all)")
    else:
        from gpucloud.catalog.prices import price_source
        from gpucloud.ui.plan_notes import catalog_ages

        ages = catalog_ages((s.kind, s.date) for s in map(price_source, rows))
        note(
            f"{len(rows)} offerings; prices: {ages}; * = an estimated or old price, not a quote; "
            "spot '-' = no spot price in the catalog; sources in the catalog data (--json for machines)."
        )


def _catalog_table(rows: list[Offering], *, mark: bool) -> Table:
    from gpucloud.catalog.prices import price_source
    from gpucloud.ui.plan_notes import source_cell  # a table of prices only

    table = _table(
        "GPU", "cloud", "region", "instance type", "GPUs", "vCPU", "GiB", "$/h", "$/h\nspot", "status", SOURCE
    )
    for o in rows:
        source = price_source(o)
        table.add_row(
            o.gpu,
            o.cloud,
            o.region,
            o.instance_type,
            str(o.gpu_count),
            str(o.vcpus),
            f"{o.memory_gib:g}",
            f"{o.price_per_hour:.3f}" + ("*" if mark and source.kind in ("estimate", "old") else ""),
            f"{o.spot_price_per_hour:.3f}" if o.spot_price_per_hour is not None else "-",
            o.status_text(),
            source_cell(source),
        )
    return table


def print_gpus(summaries: list[GpuSummary]) -> None:
    """`gpucloud gpus`: price, place and instance type each on a line of their own, so the instance
    name is never cut; architecture, memory and clouds give way first on a narrow terminal."""
    from gpucloud.catalog.prices import price_source

    def cell(o: Offering, price: float) -> str:
        mark = {"estimate": " (estimate)", "old": " (old)"}.get(price_source(o).kind, "")
        return (
            f"${price / o.gpu_count:.3f}/GPU-h{mark}\n{o.gpu_count} × ${price:.3f}/h\n"
            f"{o.cloud} {o.region}\n{o.instance_type}"
        )

    table = _table("GPU", "GiB", "architecture", "clouds", "cheapest\non-demand", "cheapest\nspot")
    for s in summaries:
        od = cell(s.on_demand, s.on_demand.price_per_hour) if s.on_demand else "retired" if s.retired else "-"
        sp = cell(s.spot, s.spot.spot_price_per_hour) if s.spot and s.spot.spot_price_per_hour is not None else "-"
        table.add_row(s.name, f"{s.memory_gib:g}", s.architecture, ",".join(s.clouds) or "-", od, sp)
    _print(table, optional=("architecture", "GiB", "clouds"))
    for s in summaries:
        if s.retired:
            note(f"{s.name}: no longer offered: {s.retirement()}")
    note(
        "prices are per GPU-hour, so 1- and 8-GPU machines compare; below each: the machine's GPU count and "
        "$/h, and where; spot '-' = no observed spot price; (estimate) = not a quote."
    )


def stack_for(gpu: str, *, cuda: str | None, driver: str | None, framework: str | None) -> Stack:
    """Resolve a stack from the command line, validating pins exactly as a job file would."""
    from dataclasses import replace

    from pydantic import ValidationError

    from gpucloud.catalog import resolve_gpu_name
    from gpucloud.errors import UserError
    from gpucloud.plan.stacks import resolve_stack
    from gpucloud.spec.load import StackSpec

    model = resolve_gpu_name(gpu)
    if model is None:
        raise UserError(f"{gpu!r} is not a GPU gpucloud knows.", hint=_gpu_hint(gpu))
    pins: dict[str, str] = {}
    if cuda:
        pins["cuda"] = cuda
    if driver:
        pins["driver"] = driver
    if framework:
        pins["framework"] = framework
    try:
        spec = StackSpec.model_validate(pins)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"--{first['loc'][0]}: {first['msg']}.") from None
    if framework:
        return resolve_stack(model, spec)
    # Without --framework, show what a PyTorch job gets (the common question); where the GPU has no
    # official PyTorch (K40), show the bare stack and say why.
    try:
        return resolve_stack(model, spec.model_copy(update={"framework": "pytorch"}))
    except UserError as exc:
        bare = resolve_stack(model, spec)
        return replace(bare, warnings=(*bare.warnings, exc.message))


def print_stack(stack: Stack, *, brief: bool = False) -> None:
    fields = [
        ("GPU", "gpu", f"{stack.gpu} ({stack.architecture}, compute capability {stack.compute_capability})"),
        ("driver", "driver", f"R{stack.driver} (>= {stack.min_driver_version})" if stack.driver != "none" else "none"),
        ("CUDA", "cuda", stack.cuda),
        ("cuDNN", "cudnn", stack.cudnn),
        ("OS image", "os_image", stack.os_image),
        (
            "framework",
            "framework",
            stack.framework if stack.framework == "none" else f"{stack.framework} {stack.framework_version}",
        ),
    ]
    if brief:
        say("Stack: " + ", ".join(f"{label} {value}" for label, _, value in fields[1:]))
        return
    table = _table("", "choice", "why", title=f"Software stack for {stack.gpu or 'a CPU-only job'}")
    for label, key, value in fields:
        table.add_row(label, value, stack.reasons.get(key, ""))
    _print(table)
    if stack.driver != "none":
        say(
            "Installs: "
            + " ".join(
                [
                    "linux-headers-$(uname -r)",
                    *stack.driver_lock,
                    *stack.driver_packages,
                    *stack.cuda_packages,
                    *stack.cudnn_packages,
                ]
            )
            + (f"; pip {' '.join(stack.framework_pip)}" if stack.framework_pip else "")
        )
    _warn(stack.warnings)


# ---- gpucloud run: the plan summary and the prompt -------------------------------------------------


def ask(question: str) -> bool:
    """A yes/no prompt on stderr; no answer (EOF) is no."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = input()
    except EOFError:
        return False
    return answer.strip().lower() in {"y", "yes"}


def print_plan_summary(plan: Plan) -> None:
    """`run`'s plan line. Where the provider installs no stack (this machine, your hosts) the GPU is
    whatever the machine has: said here, as information, not as a warning line of its own."""
    from gpucloud.contract import registry as providers

    c = plan.candidates[0]
    spec = plan.spec
    gpu = f"{c.gpu_count} x {c.gpu}" if c.gpu else "no GPU"
    own_stack = bool(c.gpu) and not providers.capabilities(c.cloud).install_stack
    gpu += " if the machine has it, else the CPU; its own driver and CUDA" if own_stack else ""
    market = "spot" if c.spot else "on-demand"
    more = f"; {len(plan.candidates) - 1} fallback candidate(s)" if len(plan.candidates) > 1 else ""
    note(
        f"plan: {c.cloud}/{c.region}/{c.instance_type} ({gpu}, {market}) x {c.num_nodes} node(s): "
        f"${c.total_per_hour:.3f}/h, at most ${c.estimated_cost:.2f} for max_duration "
        f"{fmt_seconds(spec.max_duration)}{more}"
    )
    _warn(plan.warnings)  # the plan's notes (a machine's own GPU) are in the line above


# ---- down / gc: what was torn down -----------------------------------------------------------------


def resource_lines(records: Sequence[ResourceRecord], left: set[int] | None) -> list[str]:
    """One line per resource a teardown handled: its kind and id (a name where the cloud gave no
    id), where, and whether it is gone; `left`: the journal rows still alive afterwards (None: a
    dry run, nothing was deleted)."""
    from gpucloud.ui.untrusted import shown  # ids came back from a cloud or a host

    lines = []
    for r in records:
        where = f"{r.cloud}/{r.region}" if r.region else r.cloud
        if left is None:
            state = "would be deleted" if r.status != "intent" else "would be looked for (creation was under way)"
        elif r.status == "intent" and r.id not in left:
            state = "never created"
        else:
            state = "NOT deleted" if r.id in left else "deleted"
        lines.append(f"  {r.kind} {shown(r.cloud_id or r.name or '?', limit=120)} ({where}): {state}")
    return lines


# ---- status / ls ------------------------------------------------------------------------------------


def print_runs(runs: list[RunRecord], now: float) -> None:
    """The runs table of `ls`/`status`: fits the output width. The run id and the instance type stay
    whole (a status wraps at its words); PHASE and ELAPSED give way first, named on stderr; a run id
    folds only when nothing else helps. A non-zero exit code rides on the status."""
    from gpucloud.ui.untrusted import shown  # a node's words; `plan` and `catalog` start without it

    table = Table("RUN", "STATUS", "PHASE", "ELAPSED", "COST", "WHERE", right=("ELAPSED", "COST"))
    for r in runs:
        exit_note = f" ({r.exit_code})" if r.exit_code not in (None, 0) else ""
        table.add_row(
            r.id,
            r.status + exit_note + (" (detached)" if r.detached and not r.final and r.status != "kept" else ""),
            shown(r.phase or "-"),  # as --json says it: a run that ended shows the last phase it reached
            fmt_seconds(r.elapsed(now)),
            f"${r.cost(now):.4f}",
            f"{r.cloud}/{r.region}\n{r.instance_type}" if r.cloud else "-",
        )
    _print(table, optional=("PHASE", "ELAPSED"), foldable=("STATUS",), last_resort=("RUN",))


def print_run_detail(run: RunRecord, phases: dict[str, float], alive: list[ResourceRecord], now: float) -> None:
    """One run: where, cost (summed over its attempts), deadline, phases, resources not yet deleted."""
    from gpucloud.ui.untrusted import shown  # a node's words; `plan` and `catalog` start without it

    lines = [
        f"run        {run.id}",
        f"status     {run.status}"
        + (f" (exit {run.exit_code})" if run.exit_code is not None else "")
        + (" (detached)" if run.detached and not run.final and run.status != "kept" else ""),
        f"phase      {shown(run.phase or '-')}" + (" (the last it reached)" if run.final and run.phase else ""),
        f"where      {run.cloud}/{run.region}/{run.instance_type} x {run.num_nodes} node(s)",
        f"elapsed    {fmt_seconds(run.elapsed(now))}",
        f"cost       ${run.cost(now):.4f} (${run.price_per_hour:.3f}/h per node)",
    ]
    if len(run.attempts) > 1:
        lines.append(
            f"attempts   {len(run.attempts)}: "
            + ", ".join(
                f"{a.cloud}/{a.region}/{a.instance_type} ({a.end_reason or ('running' if a.launched else 'open')})"
                for a in run.attempts
            )
        )
    if run.deadline:
        lines.append(f"deadline   {datetime.fromtimestamp(run.deadline, UTC):%Y-%m-%d %H:%M:%S} UTC")
    if run.artifacts_dir:
        lines.append(f"artifacts  {run.artifacts_dir}")
    if run.message:
        lines.append(f"message    {shown(run.message)}")  # a node's or job's words, fenced
    if phases:
        lines.append("phases     " + ", ".join(f"{k} {fmt_seconds(v)}" for k, v in phases.items()))
        from gpucloud.ui.timeline import format_phases  # where the billed time went

        timeline = format_phases(phases)
        if timeline:
            lines.append("timeline   " + timeline + (" (slowest node per stage)" if run.num_nodes > 1 else ""))
    if alive:
        lines.append(
            f"resources  {len(alive)} not yet deleted: "
            + ", ".join(f"{r.kind} {r.cloud_id or r.name} ({r.status})" for r in alive)
        )
    width = output_width()  # a long line continues under its value, not under its label
    print("\n".join(fill(line, width, continuation=" " * 11) for line in lines))


# ---- cost ---------------------------------------------------------------------------------------------


def print_cost(report: dict[str, Any]) -> None:
    """`gpucloud cost`: a line per run, a table of its attempts under it, and the totals
    (docs/SPOT.md). What the command is for (cost, on-demand cost) stays on a narrow terminal; the
    attempt number and the hourly price give way first, the end reason wraps."""
    for run in report["runs"]:
        say(
            f"run {run['run_id']} ({run['status']}): ${run['cost']:.4f}, on-demand ${run['on_demand_cost']:.4f}, "
            f"saving ${run['saving']:.4f}"
        )
        if not run["attempts"]:
            continue
        table = _table("#", "where", "market", "$/h\nper node", "nodes ×\nbilled", "$ cost", "$ on-\ndemand", "end")
        for a in run["attempts"]:
            nodes = len(a["nodes"])
            per_node = a["billed_seconds"] / nodes if nodes else 0.0
            table.add_row(
                str(a["attempt"]),
                f"{a['cloud']}/{a['zone'] or a['region']}\n{a['instance_type']}",
                a["market"],
                f"{a['price_per_hour']:.4f}",
                f"{nodes} × {fmt_seconds(per_node)}",
                f"{a['cost']:.4f}",
                f"{a['on_demand_cost']:.4f}",
                a["end_reason"] or ("running" if a["launched"] else "open"),
            )
        _print(table, optional=("#", "$/h\nper node"), foldable=("end",))
    total = report["total"]
    say(
        f"total: {total['runs']} run(s), ${total['cost']:.4f}; on-demand for the same time "
        f"${total['on_demand_cost']:.4f}; saving ${total['saving']:.4f}"
    )
    print_budgets(report.get("budgets", []))


def print_budgets(state: list[dict[str, Any]]) -> None:
    """docs/TEAMS.md: each budget and what was spent against it this period."""
    for b in state:
        left = "OVER" if b["over"] else f"${b['left']:.2f} left"
        say(f"budget {b['scope']} {b['name']} ({b['period']}): ${b['spent']:.2f} of ${b['budget']:.2f}, {left}")
