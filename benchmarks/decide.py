"""How long ``decide()`` takes per call with a large governance snapshot.

Run: ``python benchmarks/decide.py [--calls N] [--seed S]``. Prints, per scenario,
the median (p50), p99 and worst time per call in microseconds, timed with
``time.perf_counter_ns`` around each call, and the time to build the snapshot.

Scenarios:

- ``realistic``: 10,000 rules over 400 tools and 60 agents (500 of them on
  ``bash_executor``), 1,000 standing consents, a policy; a mix of calls in which
  every line (0–6) decides. Target: p99 ≤ 50 µs.
- ``one shell``: 10,000 rules all on ``bash_executor`` (allow and deny, every
  agent and single agents), deciding shell commands of several shapes, among
  them commands with globs and ``$`` words, and ``sneaky`` ones that try to name
  a program past the rules with a glob or an expansion (``/bin/r? -rf /``,
  ``/usr/bin/[g]it``, ``{r,}m``, ``${X:-rm}``). Target: p99 ≤ 100 µs.
- ``plain scan``: the same one-shell calls answered by scanning every rule with
  ``rule_matches``, what ``decide()`` would cost without its index.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from apollia_nb.governance import Call, Family, GovernanceView, Policy, Rule, decide
from apollia_nb.governance.decision import rule_matches

BASH = "bash_executor"
PROGRAMS = [
    "git", "ls", "cat", "grep", "python", "pytest", "make", "npm", "cargo", "docker", "curl",
    "wget", "rm", "mv", "cp", "chmod", "chown", "tar", "ssh", "scp", "find", "sed", "awk",
    "kubectl", "terraform", "pip", "uv", "node", "go", "java", "jq", "head", "tail", "wc",
]
SUBCOMMANDS = ["status", "log", "push", "pull", "diff", "run", "build", "test", "install", "-la", "-rf", "-q", "--help"]


def percentile(sorted_ns: Sequence[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000


def time_calls(fn: Callable[[Call, GovernanceView], object], calls: Sequence[Call], view: GovernanceView, n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for i in range(n):
        c = calls[i % len(calls)]
        t0 = clock()
        fn(c, view)
        out.append(clock() - t0)
    return out


def report(label: str, ns: list[int]) -> None:
    s = sorted(ns)
    print(
        f"  {label:<34} n={len(s):>7}  p50={percentile(s, 0.50):8.1f} µs  p99={percentile(s, 0.99):8.1f} µs"
        f"  max={s[-1] / 1000:9.1f} µs  mean={statistics.fmean(s) / 1000:7.1f} µs"
    )


def command(rng: random.Random) -> str:
    return " ".join([rng.choice(PROGRAMS), *rng.sample(SUBCOMMANDS, rng.randint(0, 2))])


# --- realistic ---------------------------------------------------------------------------


def realistic_view(rng: random.Random, developer_mode: bool = True, readable: bool = True) -> GovernanceView:
    agents = [f"agent{i}" for i in range(60)]
    tools = [f"tool{i}" for i in range(400)]
    rules: list[Rule] = []
    for i in range(9_500):
        tool = rng.choice(tools)
        prefix = rng.choice([None, f"data/{rng.randrange(1000)}/", f"secrets/{rng.randrange(100)}", f"https://host{rng.randrange(50)}.example/"])
        rules.append(Rule(tool, "deny", prefix, rng.choice([*agents[:10], "*"]), id=f"r{i}"))
    for i in range(500):
        effect = "allow" if i % 3 else "deny"
        rules.append(Rule(BASH, effect, command(rng), rng.choice([*agents[:10], "*"]), id=f"b{i}"))
    rng.shuffle(rules)
    families = [f for f in Family if f not in (Family.EXECUTE,)]
    consents = set()
    while len(consents) < 1_000:
        consents.add((f"agent{rng.randrange(400)}", rng.choice(families)))
    policy = Policy(refuse_tools={"tool0", "tool1"}, refuse_connections={"evil-mcp"}, refuse_families=set())
    return GovernanceView(rules=rules, consents=consents, developer_mode=developer_mode, policy=policy, readable=readable)


def realistic_calls(rng: random.Random, view: GovernanceView) -> list[Call]:
    agents = [f"agent{i}" for i in range(60)]
    calls: list[Call] = []
    allow_prefixes = [r.prefix for r in view.rules if r.tool == BASH and r.effect == "allow" and r.agent == "*"]
    for _ in range(2_000):
        agent = rng.choice(agents)
        kind = rng.randrange(10)
        if kind == 0:  # line 1
            calls.append(Call(agent, rng.choice(["tool0", "tool1", "tool7"]), "read", {"path": "x"}, connection="evil-mcp"))
        elif kind == 1:  # line 2 or later: deny rules on paths
            calls.append(Call(agent, f"tool{rng.randrange(400)}", "write", {"path": f"secrets/{rng.randrange(100)}/key"}))
        elif kind == 2:  # line 3
            calls.append(Call(agent, f"tool{rng.randrange(400)}", rng.choice(["read", "conversation", "memory"]), {"path": f"notes/{rng.randrange(9)}"}))
        elif kind in (3, 4):  # line 4: allow (rule), ask with always, ask once/refuse
            shape = rng.randrange(3)
            text = rng.choice(allow_prefixes) + " --flag" if shape == 0 else command(rng) if shape == 1 else f"{command(rng)} | grep x"
            calls.append(Call(agent, BASH, "execute", {"command": text}))
        elif kind == 5:  # line 5: profile
            calls.append(Call(agent, "remember_fact", "profile", {"fact": "likes tea"}))
        elif kind in (6, 7):  # line 5 (consent or grant) or 6
            grants = {rng.choice([Family.WRITE, Family.SEND])} if rng.random() < 0.3 else set()
            consented = f"agent{rng.randrange(60)}"
            calls.append(Call(consented, f"tool{rng.randrange(2, 400)}", rng.choice(["write", "send", "read_personal"]), {"to": "someone"}, run_grants=grants))
        else:  # line 6: unclassified
            calls.append(Call(agent, f"mcp_tool{rng.randrange(50)}", None, {"q": "?"}, connection="good-mcp"))
    return calls


# --- one shell -----------------------------------------------------------------------------


def one_shell_view(rng: random.Random) -> GovernanceView:
    agents = [f"agent{i}" for i in range(20)]
    rules = []
    for i in range(10_000):
        words = [rng.choice(PROGRAMS), *rng.sample(SUBCOMMANDS, rng.randint(0, 2))]
        if rng.random() < 0.3:  # programs nobody calls: rules that must be skipped cheaply
            words[0] = f"{words[0]}{i}"
        rules.append(Rule(BASH, "deny" if i % 2 else "allow", " ".join(words), rng.choice([*agents, "*"]), id=f"s{i}"))
    return GovernanceView(rules=rules, developer_mode=True)


SHAPES: dict[str, Callable[[random.Random], str]] = {
    "simple": lambda rng: command(rng),
    "chained": lambda rng: f"{command(rng)} && {command(rng)}; {command(rng)}",
    "quoted": lambda rng: f"{command(rng)} -m 'a message' \"x y\"",
    "wrapped": lambda rng: f"sudo bash -c '{command(rng)} | {command(rng)}'",
    "globs": lambda rng: f"{command(rng)} ~/src/*.py",
    "expansion ($)": lambda rng: f"{command(rng)} $HOME/x",
    "sneaky": lambda rng: rng.choice([
        lambda p: f"/bin/{p[:-1]}? -rf /", lambda p: f"/usr/bin/[{p[0]}]{p[1:]} x", lambda p: f"{{{p[0]},}}{p[1:]} -q",
        lambda p: f"${{X:-{p}}} --help", lambda p: f"$HOME/{p} status", lambda p: f"{p[0]}${{X}}{p[1:]} x",
    ])(rng.choice(PROGRAMS)),
}


def time_split(calls: Sequence[Call], view: GovernanceView, n: int) -> dict[str, list[int]]:
    """Times per call, split by whether a deny rule refused it (a scan stops early then)."""
    ns = time_calls(decide, calls, view, n)
    split: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(ns):
        d = decide(calls[i % len(calls)], view)
        split["refused" if d.line == 2 else f"{d.outcome} (no deny matches)"].append(t)
    return split


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    print(f"python {sys.version.split()[0]}, {args.calls} calls per scenario")

    t0 = time.perf_counter()
    view = realistic_view(rng)
    built = time.perf_counter() - t0
    print(f"realistic: {len(view.rules)} rules, {len(view.consents)} consents; snapshot built in {built * 1000:.0f} ms")
    calls = realistic_calls(rng, view)
    unreadable = GovernanceView(rules=view.rules, consents=view.consents, developer_mode=True, policy=view.policy, readable=False)
    time_calls(decide, calls, view, 5_000)  # warm up
    ns = time_calls(decide, calls, view, args.calls)
    by_line: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(ns):
        by_line[decide(calls[i % len(calls)], view).line].append(t)
    ns0 = time_calls(decide, calls, unreadable, args.calls // 10)
    by_line[0] = [t for i, t in enumerate(ns0) if decide(calls[i % len(calls)], unreadable).line == 0]
    report("all calls", ns)
    for line in sorted(by_line):
        report(f"line {line}", by_line[line])

    t0 = time.perf_counter()
    shell = one_shell_view(rng)
    built = time.perf_counter() - t0
    print(f"one shell: {len(shell.rules)} rules on {BASH}; snapshot built in {built * 1000:.0f} ms")
    agents = [f"agent{i}" for i in range(20)]
    for name, shape in SHAPES.items():
        shell_calls = [Call(rng.choice(agents), BASH, "execute", {"command": shape(rng)}) for _ in range(500)]
        n = args.calls // 10
        for outcome, ns in sorted(time_split(shell_calls, shell, n).items()):
            report(f"{name}: {outcome}", ns)
    simple = [Call(rng.choice(agents), BASH, "execute", {"command": command(rng)}) for _ in range(500)]
    for outcome, ns in sorted(_split(plain_scan, simple, shell, 200).items()):
        report(f"plain scan, simple: {outcome}", ns)
    return 0


def _split(fn: Callable[[Call, GovernanceView], object], calls: Sequence[Call], view: GovernanceView, n: int) -> dict[str, list[int]]:
    ns = time_calls(fn, calls, view, n)
    split: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(ns):
        split["refused" if decide(calls[i % len(calls)], view).line == 2 else "no deny matches"].append(t)
    return split


def plain_scan(call: Call, view: GovernanceView) -> object:
    """Lines 2 and 4 as a scan of every rule: the cost the index avoids."""
    for rule in view.rules:
        if rule.effect == "deny" and rule_matches(rule, call):
            return rule
    for rule in view.rules:
        if rule.effect == "allow" and rule_matches(rule, call):
            return rule
    return None


if __name__ == "__main__":
    sys.exit(main())
