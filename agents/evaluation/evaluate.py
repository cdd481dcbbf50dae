"""`pdgym-eval`: run one policy (a baseline by name or a trained agent by path) on a scenario over seeds.

    pdgym-eval policy=NAME_OR_MODEL_PATH scenario=NAME seeds=[0,1,2] hydra.run.dir=DIR

writes DIR/metrics.json (per metric: mean, std, 95% Student-t interval, per-seed values) and
DIR/requests.csv (the per-request tables of every seed, with a `seed` column; `tables=parquet`: .parquet).

The runs themselves are agents/evaluation/runner.py (bounded by a wall-time budget), the statistics
agents/evaluation/stats.py, the metric names agents/evaluation/metric_keys.py. Held-out splits (conf/splits,
envs/splits.py): seed i of a split runs simulator seed `seed_base + i`; on a trace workload it also replays
its own segment of the trace rows reserved for that split, so agents are trained, validated and tested on
disjoint traffic.
"""

from __future__ import annotations

from pdgym.agents.evaluation.candidates import Candidate, resolve
from pdgym.agents.evaluation.metric_keys import check_metric_names, class_metric, direction
from pdgym.agents.evaluation.runner import check_budget, check_policies, evaluate, write_evaluation
from pdgym.envs.sim import Simulator
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import check_table_format
from pdgym.envs.sim.validation import check_bool, check_seed_list
from pdgym.envs.splits import apply_split


# --------------------------------------------------------------------------- the app
def _app(cfg) -> dict:
    from pdgym.agents.common import run_dir, to_container
    from pdgym.agents.evaluation import stalls
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    data = to_container(cfg)  # unknown keys already failed in Hydra (struct mode)
    cand, seeds, split_name, show, budget, others = checked(data)
    split = data["splits"][split_name] if split_name else None
    scenario = data.get("scenario_name", "scenario")
    data = agent_traffic(data, cand, scenario)
    ev = evaluate(data, cand, seeds, split, others, progress=bool(data["progress"]),
                  desc=f"{cand.label} on {scenario}", budget_s=budget)
    out = run_dir()
    allow = bool(data.get("allow_stalled"))
    oracle = bool(data.get("oracle"))  # true output lengths exposed: whatever the policy, not a deployable row
    kind = "hindsight" if oracle else cand.kind
    path = write_evaluation(ev, out, scenario, {"split": split_name, "budget_s": budget, "allow_stalled": allow,
                                                "kind": kind, "oracle": oracle}, data.get("tables", "csv"))
    stats = ev.stats()
    ci = escape("[min, max]") if len(seeds) <= 2 else "95% CI"  # a bootstrap over 2 seeds is their range
    # the title as its own line: inside the table rich wraps it to the table's width ("seeds [0, / 1, 2]")
    print(f"{cand.label} ({kind}{', oracle: true' if oracle else ''}, {cand.point}) on {scenario}, seeds {seeds}"
          f" of the {split_name or 'scenario as it is'}{' split' if split_name else ''}, "
          f"{(data.get('workload') or {}).get('num_requests')} requests each")
    t = Table(caption=("one seed: no interval" if len(seeds) == 1 else escape("[min, max] of the 2 seeds (a 95% "
                       "interval needs more seeds)") if len(seeds) == 2 else "95% CI: percentile bootstrap of the mean "
                       "over seeds"))
    for col in ("metric", "direction", "mean", ci, "std"):
        t.add_column(col, justify="left" if col in ("metric", "direction") else "right")
    for k in with_class_rows(show, stats):
        st = stats.get(k)
        if st is None:  # a per-class name of a class this scenario does not have
            t.add_row(k, "-", "no such SLO class in this scenario", "-", "-")
            continue
        if st["stalled"] and k not in stalls.KEPT:
            cells = (stalls.cell(st["stalled"], len(seeds)), "-", "-")
        else:
            cells = (f"{st['mean']:.4g}", escape(f"[{st['ci_low']:.4g}, {st['ci_high']:.4g}]"), f"{st['std']:.3g}")
        t.add_row(k, "higher is better" if direction(k) > 0 else "lower is better", *cells)
    Console(width=max(Console().width, 110)).print(t)
    for s, m in zip(ev.seeds, ev.per_seed):
        if m["stopped"]:
            print(f"seed {s} stopped early ({m['rejected']:.0f} requests rejected): {m['stopped']}")
    print(f"metrics in {path}")
    stalls.refuse("pdgym-eval", [f"{cand.label} seed {s}" for s, m in zip(ev.seeds, ev.per_seed) if m["stopped"]],
                  allow, sweep_checked=True)  # a multirun's jobs go on; main's after_sweep exits 1 at its end
    return stats


def with_class_rows(show: list[str], stats: dict) -> list[str]:
    """`show`, plus, when the runs have several SLO classes, the SLO rows (SLO_ROWS) and each class's attainment
    and TTFT p99 (slo_attainment_chat, ttft_p99_chat, ...) that `show` does not list already."""
    classes = [k[len("slo_attainment_"):] for k in stats if class_metric(k) == "slo_attainment"]
    if len(classes) < 2:
        return list(show)
    extra = [*SLO_ROWS, *(f"{k}_{c}" for c in classes for k in ("slo_attainment", "ttft_p99"))]
    return [*show, *(k for k in extra if k not in show)]


SLO_ROWS = ("slo_attainment", "goodput_rps", "early_rejections")


def agent_traffic(data: dict, cand: Candidate, scenario: str, app: str = "pdgym-eval") -> dict:
    """An agent on another scenario than its training one: one warning line; a zoo agent on its own: its training
    overrides where the command line left the scenario's values (agents/evaluation/transfer.py). pdgym-enjoy too."""
    from pdgym.agents.evaluation import transfer
    from pdgym.envs.scenario import load_scenario

    if cand.kind != "agent":
        return data
    transfer.warn_transfer(app, cand.label, cand, scenario)
    data, applied = transfer.with_training_traffic(data, cand, load_scenario(scenario).raw)
    if applied:
        print(f"{cand.label}: its training traffic applied: {' '.join(applied)} (give a key on the command line to "
              "change it)", flush=True)
    return data


def alias_policy_argv(argv: list[str]) -> list[str]:
    """`policy=X` names the policy under test; `policy` is also a config group (policy/prefill, ...), so
    Hydra would read it as a group choice: the command line is rewritten to the `eval_policy` key."""
    return [("eval_policy=" + a.split("=", 1)[1]) if a.split("=", 1)[0] in ("policy", "+policy") else a
            for a in argv]


def check_policy_given(value) -> None:
    """`policy=` names the policy under test (pdgym-eval, pdgym-enjoy): it must be given."""
    if value in (None, "???", ""):
        raise ConfigError("policy: missing; give policy=BASELINE_NAME, policy=PATH/TO/RUN_OR_MODEL.zip or "
                          "policy=zoo:NAME (a shipped agent)")
    if not (isinstance(value, str) or (isinstance(value, dict) and isinstance(value.get("name"), str))):
        raise ConfigError(f"policy: got {value!r}; give a baseline name, {{name: NAME, KEY: VALUE}} or a run folder "
                          "/ model zip")


def check_no_seed(data: dict, instead: str) -> None:
    """The root config's single `seed` means nothing to an app that takes run indices (eval.yaml and
    enjoy.yaml null it): a given one would be ignored without a word, so it is refused with `instead`."""
    if data.get("seed") is not None:
        raise ConfigError(f"seed: got {data['seed']!r}; {instead}, not seed=")


def check_split(data: dict) -> str | None:
    """The `split` key: a name of `splits` (conf/splits) or null."""
    split_name, splits = data.get("split"), data.get("splits") or {}
    if split_name is not None and split_name not in splits:
        raise ConfigError(f"split: got {split_name!r}; allowed: {', '.join(splits)}, null")
    return split_name


def checked(data: dict) -> tuple:
    """The config's checks that need no run, one place for `validate` (before Hydra creates the run folder,
    agents/front_door.hydra_cli) and `_app`: (policy under test, seeds, split name, metrics to show, budget,
    the policies at the other points)."""
    check_policy_given(data.get("eval_policy"))
    check_no_seed(data, "pdgym-eval runs every run index of seeds=[...] (e.g. seeds=[5])")
    check_bool(data.get("progress"), "progress")
    check_bool(data.get("allow_stalled", False), "allow_stalled")
    seeds = check_seed_list(data.get("seeds"), "seeds")
    split_name = check_split(data)
    show = check_metric_names("show", data.get("show"))
    budget = check_budget("budget_s", data.get("budget_s"))
    check_table_format(data.get("tables", "csv"))
    cand = resolve(data["eval_policy"], data.get("point"))
    others = dict(data.get("policy") or {})
    check_policies({k: v for k, v in others.items() if k != cand.point})
    check_not_shadowed(data, cand)
    return cand, seeds, split_name, show, budget, others


def check_not_shadowed(data: dict, cand: Candidate) -> None:
    """The policy under test replaces `policy.<its point>`: a change made there (`policy/prefill=...`,
    `policy.prefill.KEY=...`) would be dropped without a word, so it is refused with the way to say it."""
    from pdgym.envs.scenario import load_scenario

    name = data.get("scenario_name")
    given = (data.get("policy") or {}).get(cand.point)
    if not name or given is None:
        return
    if given != load_scenario(str(name)).policy.get(cand.point):
        how = (f"policy={{name: {cand.spec['name']}, KEY: VALUE}}" if cand.kind == "baseline"
               else "the agent's own configuration")
        raise ConfigError(f"policy.{cand.point}: changed to {given!r}, but the policy under test ({cand.label}) "
                          f"takes the {cand.point} decision point and replaces it; give its parameters as {how}")


def validate(cfg) -> None:
    """pdgym-eval's validate hook: `checked`, then the first run's simulator is built (its config, trace
    segment and capacity checks), a baseline under test in its place (its parameters, and whether the cluster
    can run it: SBS on a colocated cluster), so a bad value fails before Hydra creates the run folder."""
    from pdgym.agents.common import sim_config_from, to_container
    from pdgym.baselines import make_policies

    data = to_container(cfg)
    cand, seeds, split_name, _, _, others = checked(data)
    raw, seed = apply_split(data, data["splits"][split_name] if split_name else None, seeds[0])
    pols = dict(make_policies(others), **{cand.point: cand.build()})  # an agent too: can it run on this cluster?
    Simulator(sim_config_from(raw), pols, seed=seed).run(until=0.0)  # policies bound to the cluster


# Root-config keys pdgym-eval composes but never reads: refused, not dropped (agents/front_door.refuse_unused).
UNUSED = {"compare": "pdgym-eval runs one policy: compare several with pdgym-leaderboard (or pdgym-sim compare=)",
          "trace": "pdgym-eval writes no trace: pdgym-sim trace=true does", "plots": "pdgym-eval draws no plots"}


def main(argv: list[str] | None = None) -> None:
    """pdgym-eval: one-line errors, no run folder before the config is checked (agents/front_door.hydra_cli)."""
    from pdgym.agents.evaluation.stalls import sweep_check
    from pdgym.agents.front_door import hydra_cli

    hydra_cli("pdgym-eval", "eval", validate=validate, rewrite_argv=alias_policy_argv, unused=UNUSED,
              after_sweep=lambda d: sweep_check("pdgym-eval", d))(_app)(argv)


if __name__ == "__main__":
    main()
