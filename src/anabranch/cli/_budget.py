"""``--budget`` and ``--tenant`` for ``run`` and ``resume``; budget lines for ``show``."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine is imported when it is needed (a fast ``--help``)
    from anabranch.agents import Budget
    from anabranch.runtime._report import RunNode, Totals
    from anabranch.store import SessionRecord, Store

__all__ = ["add_budget_arguments", "budget_lines", "parse_budget", "stop_label"]

_TOKENS = re.compile(r"^(\d+(?:\.\d+)?)([kKmM]?)$")
_USD = re.compile(r"^\$(\d+(?:\.\d+)?)$|^(\d+(?:\.\d+)?)(?:usd|USD)$")
_HELP = (
    "what the session may spend: tokens (150k, 2M, tokens=2000000), dollars ($5, 5usd, "
    "usd=5) or both, comma-separated"
)


def parse_budget(spec: str) -> Budget:
    """``--budget`` text as a ``Budget``: ``2M``, ``$5``, ``tokens=150k,usd=2.5``."""
    import pydantic

    from anabranch.agents import Budget

    fields: dict[str, Any] = {}
    for part in (p.strip() for p in spec.split(",")):
        key, _, value = part.partition("=") if "=" in part else ("", "", part)
        key = key.strip().lower()
        tokens = _TOKENS.match(value) if key in ("", "tokens") else None
        dollars = _USD.match(value) if key == "" else None
        if key == "usd":
            dollars = re.match(r"^\$?(\d+(?:\.\d+)?)$", value)
        if tokens is not None and key != "usd":
            scale = {"": 1, "k": 1_000, "m": 1_000_000}[tokens.group(2).lower()]
            fields["max_tokens"] = int(float(tokens.group(1)) * scale)
        elif dollars is not None:
            fields["max_cost_usd"] = float(next(g for g in dollars.groups() if g))
        else:
            raise argparse.ArgumentTypeError(f"cannot read budget {part!r}: {_HELP}")
    try:
        return Budget(**fields)
    except pydantic.ValidationError as exc:
        problem = "; ".join(e["msg"] for e in exc.errors())
        raise argparse.ArgumentTypeError(f"invalid budget {spec!r}: {problem}") from None


def add_budget_arguments(parser: argparse.ArgumentParser, *, tenant: bool) -> None:
    parser.add_argument("--budget", type=parse_budget, metavar="SPEC", help=_HELP)
    if tenant:
        parser.add_argument(
            "--tenant", metavar="NAME", help="who the session spends for (tenant budgets)"
        )


def stop_label(status: str, error: str | None) -> str:
    """``[incomplete: stopped by its turn limit (max_turns=8)]`` for a stopped run."""
    from anabranch.runtime._run_limits import parse_stop

    if status != "incomplete":
        return f"[{status}]"
    _, why = parse_stop(error)
    return f"[incomplete: {why or 'stopped by a limit'}]"


def _agent_budgets(outline: dict[str, Any]) -> Iterator[tuple[str, Budget]]:
    """Agent names and budgets in a session's definition outline (agents or graph tasks)."""
    from anabranch.agents import Budget

    stack = [outline, *outline.get("tasks", [])]
    while stack:
        node = stack.pop()
        name = node.get("name") if "tasks" not in node else None
        name = node.get("agent", name) if "id" in node else name
        if isinstance(name, str) and isinstance(node.get("budget"), dict):
            yield name, Budget.model_validate(node["budget"])
        stack.extend(node.get("subagents", []))


def _spent(tokens: int, cost: float, budget: Budget) -> str:
    parts = []
    if budget.max_tokens is not None:
        parts.append(
            f"{tokens:,} of {budget.max_tokens:,} tokens ({tokens / budget.max_tokens:.0%})"
        )
    if budget.max_cost_usd is not None:
        share = cost / budget.max_cost_usd
        parts.append(f"${cost:.4f} of ${budget.max_cost_usd:.2f} ({share:.0%})")
    return ", ".join(parts)


def _subtree(node: RunNode) -> tuple[int, float]:
    from anabranch.runtime._run_limits import usage_tokens

    tokens, cost = usage_tokens(node.usage), node.cost.total
    for child in node.children:
        more = _subtree(child)
        tokens, cost = tokens + more[0], cost + more[1]
    return tokens, cost


async def budget_lines(
    store: Store, session: SessionRecord, roots: list[RunNode], totals: Totals
) -> list[str]:
    """Spend against every budget of the session: its own, its tenant's, its agents'."""
    from anabranch.agents import Budget
    from anabranch.runtime._history import session_outline
    from anabranch.runtime._run_limits import period_start, usage_tokens

    lines = []
    record = await store.session_budget(session.id)
    if record is not None and record.budget is not None:
        budget = Budget.model_validate_json(record.budget)
        spent = _spent(usage_tokens(totals.usage), totals.cost.total, budget)
        lines.append(f"budget: session {spent}")
    if record is not None and record.tenant is not None:
        line = f"budget: tenant {record.tenant}"
        if record.tenant_budget is not None:
            budget = Budget.model_validate_json(record.tenant_budget)
            total = await store.tenant_spend(record.tenant, period_start(budget.per))
            period = f"this {budget.per}" if budget.per else "in all"
            line += f" {period}: {_spent(total.tokens, total.cost_usd, budget)}"
        lines.append(line)
    budgets = dict(_agent_budgets(session_outline(session)))
    stack = list(roots)
    while stack:
        node = stack.pop(0)
        stack.extend(node.children)
        agent_budget = budgets.get(node.run.agent_name)
        if agent_budget is not None:
            tokens, cost = _subtree(node)
            lines.append(
                f"budget: {node.run.agent_name} {node.run.id} {_spent(tokens, cost, agent_budget)}"
            )
    return lines
